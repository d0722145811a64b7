"""The answers to multi-version staleness: P3O's trust region on lagging tokens (``trust_region``), ESS per source and
policy version, M2PO and decoupled PPO; each gradient against one computed by hand; the learner's row bookkeeping
(`rllib_p3o.learner.row_groups`); and the claims grids' shared runs: methods said to compute the same in a regime
give the same gradient, bit for bit, on a batch with that regime's rows. Pure torch."""

import math

import pytest
import torch

from rllib_p3o.core.losses import LOSSES, LossInputs, OldLogprobs, get_loss
from rllib_p3o.core.losses.p3o import p3o_loss
from rllib_p3o.core.losses.trust_region import ess_band, outward_mask, second_moment_mask
from rllib_p3o.core.sources import POLICY_SOURCE_ID, source_id
from rllib_p3o.learner import row_groups
from rllib_p3o.sweep import grid as sweep_grid


def _grad(name, logp, behavior, adv, old=None, lagging=None, groups=None, num_groups=0, **settings):
    spec = get_loss(name)
    mask = torch.ones_like(logp, dtype=torch.bool)
    inputs = LossInputs(
        logp, behavior, adv, mask, old_logprobs=old, lagging=lagging, ess_groups=groups, num_ess_groups=num_groups
    )
    out = spec.fn(inputs, spec.make_settings(settings))
    out.loss.backward()
    return out


def _ess(log_ratios):
    r = torch.exp(torch.as_tensor(log_ratios, dtype=torch.float64))
    return float(r.sum() ** 2 / (r.numel() * (r * r).sum()))


def test_the_band_is_one_coefficient_of_variation_of_the_ratios():
    # Ratios 0.5 and 1.5: mean 1, std 0.5, ESS = 1 / (1 + 0.25) = 0.8 -> ε = 0.5.
    low, high = ess_band(torch.tensor(0.8, dtype=torch.float64))
    assert (float(low), float(high)) == pytest.approx((0.5, 1.5))
    assert [float(x) for x in ess_band(torch.tensor(1.0, dtype=torch.float64))] == [1.0, 1.0]
    r = torch.tensor([0.5, 1.5], dtype=torch.float64)
    ess = r.sum() ** 2 / (2 * (r * r).sum())
    assert float(ess_band(ess)[1] - 1) == pytest.approx(float(r.std(unbiased=False) / r.mean()))


def test_outward_mask_removes_only_tokens_pushed_further_out_on_lagging_rows():
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0], [1.5, 1.5, 0.5, 0.5, 1.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0], [1.0, -1.0, -1.0, 1.0, 1.0]])
    applies = torch.tensor([[True], [False]])
    masked = outward_mask(ratio, adv, torch.tensor(0.8), torch.tensor(1.2), applies.expand(2, 5))
    # Row 0: above the band with A > 0, below with A < 0 -> masked; pulled back toward 1 -> kept. Row 1: fresh.
    assert masked.tolist() == [[True, False, True, False, False], [False] * 5]


def test_p3o_ess_clip_gradient_by_hand():
    # One row of 4 lagging tokens, log-ratios log_r = (0.4, -0.4, 0.4, 0), A = +1 on the row.
    log_r = torch.tensor([[0.4, -0.4, 0.4, 0.0]])
    behavior = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    logp = (behavior + log_r).requires_grad_(True)
    adv = torch.tensor([1.0])
    out = _grad("p3o", logp, behavior, adv, lagging=torch.tensor([True]), trust_region="ess_clip", kl_anchor="behavior")
    ess = _ess(log_r)
    eps = math.sqrt(1 / ess - 1)
    r = torch.exp(log_r[0]).double()
    assert math.exp(0.4) > 1 + eps  # tokens 0 and 2 are above the band with A > 0: no policy gradient
    assert math.exp(-0.4) < 1 - eps  # token 1 is below the band, but A > 0 pulls it back up: kept
    # PG part: -w·A/N with w = min(r, ESS) where kept; KL part (k3_is toward π_b): (1 - ESS)·r·log r / N.
    pg = torch.tensor([0.0, -min(float(r[1]), ess), 0.0, -min(float(r[3]), ess)], dtype=torch.float64) / 4
    kl = (1 - ess) * r * torch.log(r) / 4
    torch.testing.assert_close(logp.grad[0].double(), pg + kl, rtol=1e-5, atol=1e-7)
    assert float(out.metrics["trust_masked_fraction"]) == pytest.approx(0.5)
    assert float(out.metrics["lagging_fraction"]) == 1.0
    assert float(out.metrics["trust_eps_max"]) == pytest.approx(eps, rel=1e-5)


def test_p3o_trust_region_leaves_fresh_rows_alone_and_none_is_the_old_loss():
    log_r = torch.tensor([[0.4, -0.4, 0.4, 0.0]])
    behavior = torch.full_like(log_r, -1.0)
    grads = []
    for trust_region, lagging in (("none", None), ("ess_clip", torch.tensor([False])), ("ess_band", None)):
        logp = (behavior + log_r).requires_grad_(True)
        _grad("p3o", logp, behavior, torch.tensor([1.0]), lagging=lagging, trust_region=trust_region)
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[2], rtol=0, atol=0)


def test_p3o_ess_band_masks_outside_the_caps_own_band():
    # ESS of log_r = (0.1, -0.1, 0.02, 0): the band [ESS, 1/ESS] is about [0.995, 1.005].
    log_r = torch.tensor([[0.1, -0.1, 0.02, 0.0]])
    behavior = torch.full_like(log_r, -2.0)
    logp = (behavior + log_r).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    out = _grad("p3o", logp, behavior, adv, lagging=torch.tensor([True]), trust_region="ess_band")
    ess = _ess(log_r)
    assert math.exp(0.02) > 1 / ess  # token 2 is above the band but its advantage pulls it back: kept
    # Masked: token 0 (r > 1/ESS, A > 0) and token 1 (r < ESS, A < 0).
    assert float(out.metrics["trust_masked_fraction"]) == pytest.approx(0.5)


def test_ess_per_version_groups_each_version_by_its_own_ratios():
    # Two rows: a fresh one (ratios 1) and a stale one. Per version, the fresh row's ESS is 1 and its weight 1.
    log_r = torch.tensor([[0.0, 0.0], [0.5, -0.5]])
    behavior = torch.full_like(log_r, -1.0)
    logp = (behavior + log_r).requires_grad_(True)
    _grad("p3o", logp, behavior, torch.tensor([1.0, 0.0]), groups=torch.tensor([0, 1]), num_groups=2)
    torch.testing.assert_close(logp.grad[0], torch.tensor([-0.25, -0.25]))  # -w·A/N, w = min(1, ESS_fresh = 1)
    # Per token groups ([B, T]) give the same as per row groups of the same numbering.
    logp2 = (behavior + log_r).requires_grad_(True)
    _grad("p3o", logp2, behavior, torch.tensor([1.0, 0.0]), groups=torch.tensor([[0, 0], [1, 1]]), num_groups=2)
    torch.testing.assert_close(logp.grad, logp2.grad, rtol=0, atol=0)


def test_second_moment_mask_drops_the_largest_squared_log_ratios_first():
    log_r = torch.tensor([[0.5, -0.4, 0.1, 0.0]])  # M2 = 0.25, 0.16, 0.01, 0
    mask = torch.ones_like(log_r, dtype=torch.bool)
    # Suffix means: (0.42/4, 0.17/3, 0.01/2, 0) = (0.105, 0.0567, 0.005, 0): below 0.04 from the third on.
    assert second_moment_mask(log_r, mask, 0.04).tolist() == [[False, False, True, True]]
    assert second_moment_mask(log_r, mask, 0.2).tolist() == [[True, True, True, True]]
    assert second_moment_mask(log_r, mask, 0.06).tolist() == [[False, True, True, True]]
    assert not second_moment_mask(log_r + 1.0, mask, 0.04).any()  # not even the smallest M2 is below: none kept


def test_m2po_gradient_is_the_unclipped_importance_weighted_gradient_on_kept_tokens():
    log_r = torch.tensor([[0.5, -0.4, 0.1, 0.0]])
    behavior = torch.full_like(log_r, -1.0)
    logp = (behavior + log_r).requires_grad_(True)
    out = _grad("m2po", logp, behavior, torch.tensor([2.0]))
    r = torch.exp(log_r[0])
    expected = torch.tensor([0.0, 0.0, float(-r[2] * 2 / 4), float(-r[3] * 2 / 4)])  # N counts the masked tokens
    torch.testing.assert_close(logp.grad[0], expected)
    assert float(out.metrics["m2_masked_fraction"]) == pytest.approx(0.5)
    assert float(out.metrics["m2"]) == pytest.approx(0.42 / 4)
    assert get_loss("m2po").make_settings().m2_threshold == 0.04
    with pytest.raises(ValueError, match="m2_threshold must be > 0"):
        get_loss("m2po").make_settings({"m2_threshold": 0})


def test_decoupled_ppo_gradient_masks_large_behavior_weights_and_clips_against_the_proximal_policy():
    # π_prox/π_b = e^2 (> 5: masked), 1, e^-1. πθ/π_prox = 1, e^0.5 (A > 0: clipped), 1.
    behavior = torch.tensor([[-3.0, -1.0, -1.0]])
    prox = behavior + torch.tensor([[2.0, 0.0, -1.0]])
    logp = (prox + torch.tensor([[0.0, 0.5, 0.0]])).requires_grad_(True)
    out = _grad("decoupled_ppo", logp, behavior, torch.tensor([1.0]), old=prox)
    torch.testing.assert_close(logp.grad[0], torch.tensor([0.0, 0.0, -math.exp(-1) / 3]))
    assert float(out.metrics["behavior_masked_fraction"]) == pytest.approx(1 / 3)
    assert get_loss("decoupled_ppo").old_logprobs is OldLogprobs.ALWAYS
    off = _grad("decoupled_ppo", prox.clone().requires_grad_(True), behavior, torch.tensor([1.0]), old=prox,
                behavior_weight_cap=0.0)  # fmt: skip
    assert float(off.metrics["behavior_masked_fraction"]) == 0.0


def test_new_settings_are_validated_with_the_losss_name():
    assert {"m2po", "decoupled_ppo"} <= set(LOSSES)
    with pytest.raises(ValueError, match="trust_region must be one of none, ess_clip, ess_band"):
        get_loss("p3o").make_settings({"trust_region": "clip"})
    with pytest.raises(ValueError, match="trust_region must be one of"):
        p3o_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), trust_region="x")
    with pytest.raises(ValueError, match="behavior_weight_cap must be 0"):
        get_loss("decoupled_ppo").make_settings({"behavior_weight_cap": 0.5})


def test_row_lag_lagging_rows_and_version_groups():
    behavior_id = source_id("behavior/weaker")
    offline_own, offline_other = source_id("offline/policy"), source_id("offline/behavior/weaker")
    source = torch.tensor(
        [POLICY_SOURCE_ID, POLICY_SOURCE_ID, POLICY_SOURCE_ID, behavior_id, offline_own, offline_other]
    )
    staleness = torch.tensor([0, 1, 3, -1, -1, -1])
    lag = row_groups.row_lag(staleness, steps_in_update=1)
    assert lag.tolist() == [1, 2, 4, -1, -1, -1]
    assert row_groups.other_model_rows(source).tolist() == [False, False, False, True, False, True]
    assert row_groups.lagging_rows(source, row_groups.row_lag(staleness, 0)).tolist() == [
        False, True, True, False, True, False,
    ]  # fmt: skip
    assert row_groups.lagging_rows(source[:1], staleness[:1]) is None  # fresh policy rows only
    groups, n = row_groups.ess_groups("version", source, lag)
    assert n == 6 and len(set(groups.tolist())) == 6
    groups, n = row_groups.ess_groups("source", source, lag)
    assert n == 4 and groups[0] == groups[1] == groups[2]
    assert row_groups.ess_groups("batch", source, lag) == (None, 0)


def _regime_batch(traits, rows=8, tokens=6, seed=0):
    """A batch with a regime's rows, as the learner hands it to the loss at an update's second minibatch where the
    regime has several steps: sources, lags, π_old (= πθ with one step per batch)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, tokens, generator=g) * 3
    behavior = logp + 0.3 * torch.randn(rows, tokens, generator=g)
    source = torch.zeros(rows, dtype=torch.long)
    staleness = torch.zeros(rows, dtype=torch.long)
    if sweep_grid.OTHER_MODEL_ROWS in traits and sweep_grid.OFFLINE_ROWS in traits:  # another model's recording
        source[:] = source_id("offline/behavior/weaker")
        staleness[:] = -1
    elif sweep_grid.OTHER_MODEL_ROWS in traits:  # a live model writes half of each group
        source[rows // 2 :] = source_id("behavior/weaker")
        staleness[rows // 2 :] = -1
    if sweep_grid.VERSIONS in traits:
        staleness = torch.arange(rows) % 4
    elif sweep_grid.LAGGING_ROWS in traits and sweep_grid.MULTI_STEP not in traits:  # offline rows
        source[:] = source_id("offline/policy")
        staleness[:] = -1
    lag = row_groups.row_lag(staleness, 1 if sweep_grid.MULTI_STEP in traits else 0)
    old = logp - 0.2 * torch.randn(rows, tokens, generator=g) if sweep_grid.MULTI_STEP in traits else logp
    adv = torch.randn(rows, generator=g)
    return dict(logp=logp, behavior=behavior, old=old, adv=adv, source=source, lag=lag)


def _method_gradient(method, batch):
    spec = sweep_grid.METHODS[method]
    loss = get_loss(spec.get("loss", "p3o"))
    settings = loss.make_settings(spec.get("loss_config", {}))
    groups, n = row_groups.ess_groups(loss.ess_scope_of(settings), batch["source"], batch["lag"])
    other = row_groups.other_model_rows(batch["source"])
    logp = batch["logp"].clone().requires_grad_(True)
    inputs = LossInputs(
        logp,
        batch["behavior"],
        batch["adv"],
        torch.ones_like(logp, dtype=torch.bool),
        ess_groups=groups,
        num_ess_groups=n,
        old_logprobs=batch["old"],
        other_model_rows=other if bool(other.any()) else None,
        lagging=row_groups.lagging_rows(batch["source"], batch["lag"]),
    )
    out = loss.fn(inputs, settings)
    out.loss.backward()
    return float(out.loss.detach()), logp.grad


@pytest.mark.parametrize(
    "grid",
    [
        sweep_grid.BENCH_DEVELOPMENT,
        sweep_grid.BENCH_CONFIRMATION,
        sweep_grid.PROVENANCE_DEVELOPMENT,
        sweep_grid.PROVENANCE_CONFIRMATION,
    ],
    ids=["dev", "confirm", "provenance-dev", "provenance-confirm"],
)
def test_methods_that_share_a_run_compute_the_same_loss_and_gradient_bit_for_bit(grid):
    shared = 0
    for regime in grid.regimes:
        batch = _regime_batch(
            sweep_grid.method_traits(grid.methods_in(regime)[0], sweep_grid.REGIMES[regime], grid.method_defaults)
        )
        for method in grid.methods_in(regime):
            twin = grid.same_run_as(regime, method)
            loss, grad = _method_gradient(method, batch)
            if twin == method:
                continue
            shared += 1
            twin_loss, twin_grad = _method_gradient(twin, batch)
            assert loss == twin_loss, (regime, method, twin)
            assert torch.equal(grad, twin_grad), (regime, method, twin)
    assert shared > 0


def test_methods_in_separate_runs_differ_where_the_regime_tells_them_apart():
    # The candidates are told apart where it matters: per version only under async, the trust region on lagging rows.
    grid = sweep_grid.BENCH_DEVELOPMENT
    assert grid.same_run_as("async_staleness_4", "p3o_version") == "p3o_version"
    assert grid.same_run_as("offline_stale", "p3o_version") == "p3o_source"
    assert grid.same_run_as("two_steps_per_batch", "grpo_tis_eps0.4") == "grpo_tis_eps0.4"
    batch = _regime_batch(sweep_grid.REGIMES["async_staleness_4"].traits)
    assert not torch.equal(_method_gradient("p3o_version", batch)[1], _method_gradient("p3o_source", batch)[1])
    assert not torch.equal(_method_gradient("p3o_clip", batch)[1], _method_gradient("p3o_source", batch)[1])
    two = _regime_batch(sweep_grid.REGIMES["two_steps_per_batch"].traits)
    assert not torch.equal(_method_gradient("grpo_tis_eps0.4", two)[1], _method_gradient("grpo_tis_eps0.2", two)[1])


def test_the_other_model_weight_alone_shares_a_run_only_where_it_computes_and_trains_at_the_same_rate():
    # On a weaker model's recording it is the truncation; beside a live weaker model it computes the cap, but the
    # cap's lr was chosen on the recording, where it is not the cap: no shared trial there.
    grid = sweep_grid.PROVENANCE_DEVELOPMENT
    owners = {r: grid.same_run_as(r, "p3o_other_alone") for r in ("offline_weaker", "on_policy", "behavior_weaker")}
    assert owners == {
        "offline_weaker": "p3o_other_inverse_cap",
        "on_policy": "p3o_clip_version",
        "behavior_weaker": "p3o_other_alone",
    }
    for regime, computes_the_cap in (("behavior_weaker", True), ("offline_weaker", False)):
        batch = _regime_batch(sweep_grid.REGIMES[regime].traits)
        same = torch.equal(
            _method_gradient("p3o_other_alone", batch)[1], _method_gradient("p3o_clip_version", batch)[1]
        )
        assert same == computes_the_cap, regime
