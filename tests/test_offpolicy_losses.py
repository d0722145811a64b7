"""The baselines peers ship (grpo_tis, grpo_seq_mask, cispo) and P3O's proximal variant: each gradient against one
computed by hand, their settings through the config, the learner's π_old, and the refusal of truncated sampling for
P3O's losses. The learner test runs a real RLlib LearnerGroup; the others are pure torch."""

import math

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.losses import LOSSES, LossInputs, OldLogprobs, get_loss
from rllib_p3o.core.losses.decoupled_grpo import geometric_sequence_mask, truncated_is_weights

E = math.e


def _run(name, logp, behavior, old, adv, mask=None, **settings):
    spec = get_loss(name)
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    out = spec.fn(LossInputs(logp, behavior, adv, mask, old_logprobs=old), spec.make_settings(settings))
    out.loss.backward()
    return out


def test_the_four_losses_are_registered_with_their_settings():
    assert {"grpo_tis", "grpo_seq_mask", "cispo", "p3o_proximal"} <= set(LOSSES)
    for name in ("grpo_tis", "grpo_seq_mask", "p3o_proximal", "decoupled_ppo"):
        assert get_loss(name).old_logprobs_needed(get_loss(name).make_settings()) is OldLogprobs.ALWAYS
    assert get_loss("cispo").old_logprobs_needed(get_loss("cispo").make_settings()) is OldLogprobs.NEVER
    p3o = get_loss("p3o")
    # The loss says when it needs π_old, so the learner reads none of its settings: the default anchor only for
    # batches with another model's rows, "proximal" always, "behavior" never.
    assert p3o.old_logprobs_needed(p3o.make_settings()) is OldLogprobs.FOR_OTHER_MODEL_ROWS
    assert p3o.old_logprobs_needed(p3o.make_settings({"kl_anchor": "proximal"})) is OldLogprobs.ALWAYS
    assert not p3o.uses_old_logprobs(p3o.make_settings({"kl_anchor": "behavior"}))
    assert get_loss("p3o_proximal").make_settings().kl_estimator == "k3_clamped"  # P4O's own
    assert P3OConfig().training(loss="grpo_tis").loss_settings().tis_cap == 2.0
    assert P3OConfig().training(loss="cispo").loss_settings() == get_loss("cispo").settings(1.0, 0.28)
    band = P3OConfig().training(loss="grpo_seq_mask").loss_settings()
    assert (band.seq_mask_low, band.seq_mask_high) == (0.999, 1.001)
    with pytest.raises(ValueError, match="tis_cap must be >= 1"):
        P3OConfig().training(model="/m", loss="grpo_tis", loss_config={"tis_cap": 0.5}).validate()
    with pytest.raises(ValueError, match="seq_mask_low <= 1 <= seq_mask_high"):
        P3OConfig().training(model="/m", loss="grpo_seq_mask", loss_config={"seq_mask_low": 1.01}).validate()


def test_grpo_tis_gradient_is_the_truncated_weight_times_the_clipped_surrogate():
    # π_old/π_b = e, 1, 1/e -> weights min(., 2) = 2, 1, 1/e. πθ/π_old = e^0.5, 1, 1 -> the first token is clipped
    # (A > 0, ratio above 1.2): no gradient. Others: d/dlogπθ of -w·ρ·A/N at ρ = 1 is -w·A/N.
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    old = behavior + torch.tensor([[1.0, 0.0, -1.0]])
    logp = (old + torch.tensor([[0.5, 0.0, 0.0]])).requires_grad_(True)
    out = _run("grpo_tis", logp, behavior, old, torch.tensor([2.0]))
    expected = torch.tensor([[0.0, -1.0 * 2 / 3, -(1 / E) * 2 / 3]])
    torch.testing.assert_close(logp.grad, expected)
    assert float(out.metrics["is_truncated_fraction"]) == pytest.approx(1 / 3)
    assert float(out.metrics["clip_fraction"]) == pytest.approx(1 / 3)
    torch.testing.assert_close(truncated_is_weights(old, behavior, 2.0), torch.tensor([[2.0, 1.0, 1 / E]]))


def test_grpo_seq_mask_drops_rows_outside_the_band_from_loss_and_count():
    # Row 0: π_old = π_b (geometric mean 1, kept). Row 1: π_old/π_b = e^0.01 per token (1.01 > 1.001, dropped).
    behavior = torch.tensor([[-1.0, -0.5, -0.2], [-0.3, -0.7, -1.1]])
    old = behavior + torch.tensor([[0.0, 0.0, 0.0], [0.01, 0.01, 0.01]])
    logp = old.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = _run("grpo_seq_mask", logp, behavior, old, torch.tensor([1.5, -1.0]), mask=mask)
    # Kept: row 0's 2 valid tokens, so N = 2; the gradient of -ρ·A/N at ρ = 1 is -A/N there, 0 elsewhere.
    expected = torch.tensor([[-1.5 / 2, -1.5 / 2, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    assert float(out.metrics["seq_masked_fraction"]) == pytest.approx(3 / 5)
    keep = geometric_sequence_mask(old, behavior, mask, 0.999, 1.001)
    assert keep.tolist() == [True, False]


def test_cispo_gradient_flows_through_every_token_with_the_clipped_weight():
    # r = e^0.5, 1, 1/e; clip(r, 0, 1.28) = 1.28, 1, 1/e; d/dlogπθ of -sg(w)·logπθ·A/N is -w·A/N.
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    logp = (behavior + torch.tensor([[0.5, 0.0, -1.0]])).requires_grad_(True)
    out = _run("cispo", logp, behavior, None, torch.tensor([2.0]))
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -1.0, -1 / E]]) * 2 / 3)
    assert float(out.metrics["clip_fraction"]) == pytest.approx(1 / 3)


def _ess(log_r):
    r = torch.exp(log_r)
    return float(r.sum() ** 2 / (r.numel() * (r**2).sum()))


def test_p3o_proximal_is_feynrl_p4o_cap_by_the_smaller_ess_and_kl_to_the_adaptive_mixture():
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    l_b = torch.tensor([[0.5, 0.0, -1.0]])
    logp = (behavior + l_b).requires_grad_(True)
    old = logp.detach() - torch.tensor([[0.3, -0.2, 0.1]])  # the update has moved a little from π_old
    out = _run("p3o_proximal", logp, behavior, old, torch.tensor([2.0]))

    ess_b, ess_p = _ess(l_b), _ess(logp.detach() - old)
    cap = min(ess_b, ess_p)
    w_b, w_p = 1 - ess_b, 1 - ess_p
    r = torch.exp(l_b)
    # P4O's mixture: (w_b·π_b + w_p·π_old) / (w_b + w_p), and its k3 with the exponent clamped (inside ±10 here).
    mixture = torch.log((w_b * torch.exp(behavior) + w_p * torch.exp(old)) / (w_b + w_p))
    x = logp.detach() - mixture
    hand = (-torch.minimum(r, torch.tensor(cap)) * 2.0 + (1 - cap) * (1 - torch.exp(-x))) / 3  # K'(x) = 1 - e^-x
    torch.testing.assert_close(logp.grad, hand)
    assert float(out.metrics["cap"]) == pytest.approx(cap, rel=1e-5)
    assert float(out.metrics["ess_proximal"]) == pytest.approx(ess_p, rel=1e-5)
    assert float(out.metrics["mix_weight_behavior"]) == pytest.approx(w_b / (w_b + w_p), rel=1e-4)


def test_p3o_proximal_on_the_first_step_is_p3o_anchored_at_the_behavior_policy():
    # πθ = π_old (the first minibatch of an iteration): ESS_p = 1, the mixture is π_b alone, the loss P3O's with the
    # same estimator (P4O's clamped k3, equal to k3 inside ±10).
    behavior = torch.tensor([[-1.0, -0.5, -0.2, -2.0]])
    logp = (behavior + torch.tensor([[0.4, -0.3, 0.0, -0.8]])).requires_grad_(True)
    out = _run("p3o_proximal", logp, behavior, logp.detach().clone(), torch.tensor([1.5]))
    ref = logp.detach().clone().requires_grad_(True)
    ref_out = _run("p3o", ref, behavior, None, torch.tensor([1.5]), kl_estimator="k3_clamped")
    torch.testing.assert_close(logp.grad, ref.grad)
    assert float(out.loss.detach()) == pytest.approx(float(ref_out.loss.detach()), rel=1e-6)
    assert float(out.metrics["mix_weight_behavior"]) == pytest.approx(1.0)


def test_p3o_proximal_skips_the_kl_term_when_both_policies_are_fresh():
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    logp = behavior.clone().requires_grad_(True)
    out = _run("p3o_proximal", logp, behavior, behavior.clone(), torch.tensor([2.0]))
    torch.testing.assert_close(logp.grad, torch.full_like(logp, -2.0 / 3))  # REINFORCE at weight min(1, 1)
    assert float(out.metrics["kl_weight"]) == 0.0 and float(out.metrics["kl_grad_share"]) == 0.0


def _check_untruncated_sampling(config):
    """The loss group's rule on truncated sampling alone (`rllib_p3o.driver.validation`): its first problem raised."""
    from rllib_p3o.driver.validation import _untruncated_sampling

    for problem in _untruncated_sampling(config):
        raise ValueError(problem)


def test_p3o_losses_refuse_truncated_sampling_without_kept_sets_and_grpo_does_not():
    for loss in ("p3o", "p3o_no_kl", "p3o_proximal"):
        with pytest.raises(ValueError, match=rf"loss='{loss}' needs the learner's log-probs renormalized over"):
            _check_untruncated_sampling(P3OConfig().training(model="/m", loss=loss, top_p=0.9, kept_set_cap=0))
        # Recorded kept sets (the default): the learner renormalizes over them (tests/test_kept_sets.py).
        _check_untruncated_sampling(P3OConfig().training(model="/m", loss=loss, top_p=0.9, top_k=20))
    with pytest.raises(ValueError, match="behavior model weak samples with top_p=1.0, top_k=20"):
        _check_untruncated_sampling(
            P3OConfig().training(
                model="/m", kept_set_cap=0, behavior_models=[{"model": "/w", "name": "weak", "top_k": 20}]
            )
        )
    with pytest.raises(ValueError, match="samples with top_k=100 but kept_set_cap=64"):
        _check_untruncated_sampling(P3OConfig().training(model="/m", top_k=100))
    _check_untruncated_sampling(P3OConfig().training(model="/m", loss="grpo", top_p=0.9, kept_set_cap=0))
    _check_untruncated_sampling(
        P3OConfig().training(model="/m", loss="p3o", top_p=0.9, kept_set_cap=0, logprobs_mode="raw")
    )


def test_the_learner_recomputes_pi_old_once_per_update(ray_session, tiny_model):
    from test_learner import _fixed_batch, _learner_group, _per_learner

    lg = _learner_group(tiny_model, 0, loss="grpo_tis")
    try:
        batch = _fixed_batch(tiny_model, behavior_shift=0.3)
        results = lg.update(batch=batch)
        assert _per_learner(results, m.OLD_LOGPROBS_S)[0] > 0
        # π_old is the learner's own policy at the start of the update: the one minibatch's ratio πθ/π_old is 1, so
        # nothing is clipped, and the IS weights min(π_old/π_b, 2) are those of the behavior shift.
        assert _per_learner(results, m.CLIP_FRACTION)[0] == 0.0
        assert 0.5 < _per_learner(results, "is_weight_mean")[0] < 2.0
    finally:
        lg.shutdown()


def test_the_learner_recomputes_pi_old_for_p3o_only_with_the_proximal_anchor(ray_session, tiny_model):
    from test_learner import SPACES, _fixed_batch, _per_learner

    for anchor, computed in (("behavior", False), ("proximal", True)):
        config = P3OConfig().training(
            model=tiny_model, loss="p3o", loss_config={"kl_estimator": "k3_is", "kl_anchor": anchor}, lr=3e-3
        )
        lg = config.build_learner_group(spaces=SPACES)
        try:
            results = lg.update(batch=_fixed_batch(tiny_model, behavior_shift=0.3))
            assert (m.OLD_LOGPROBS_S in results[0][DEFAULT_MODULE_ID]) is computed
            assert 0.0 <= _per_learner(results, "kl_grad_share")[0] <= 1.0
        finally:
            lg.shutdown()
