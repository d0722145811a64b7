"""The KL estimators of P3O's trust-region term (`rllib_p3o.core.losses.kl_estimators`) and the options that choose them:
hand-computed values and gradients, the exact expectation of each under the behavior policy's samples on a small
categorical example (by enumeration), first-order agreement on-policy, the proximal anchor, and the diagnostics.
Pure torch."""

import math

import pytest
import torch

from rllib_p3o import P3OConfig
from rllib_p3o.core.losses import LossInputs, get_loss
from rllib_p3o.core.losses.kl_estimators import KL_ESTIMATORS, get_kl_estimator, k3_clamped, k3_is, kl_k3
from rllib_p3o.core.losses.p3o import P3OLossSettings, p3o_loss

E = math.e


def _value_and_grad(fn, logp, anchor, behavior):
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    value = fn(lp, torch.tensor(anchor, dtype=torch.float64), torch.tensor(behavior, dtype=torch.float64))
    (grad,) = torch.autograd.grad(value.sum(), lp)
    return value.detach(), grad


def test_registered_names():
    assert set(KL_ESTIMATORS) == {"k3", "k3_clamped", "k3_is"}
    with pytest.raises(ValueError, match="unknown kl_estimator 'k2'; choose one of k3, k3_clamped, k3_is"):
        get_kl_estimator("k2")


def test_k3_values_and_gradients_by_hand():
    # l = logπθ - logπ_a = 1, -1: K = l + e^-l - 1, K' = 1 - e^-l.
    v, g = _value_and_grad(get_kl_estimator("k3"), [0.0, -2.0], [-1.0, -1.0], [-5.0, -5.0])
    torch.testing.assert_close(v, torch.tensor([1 / E, -1 + E - 1], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([1 - 1 / E, 1 - E], dtype=torch.float64))


def test_k3_tails_linear_and_the_reference_clamp_flips_the_slope():
    # At l = -12: k3 continues with the slope at -10 (1 - e^10 ≈ -22,025); FeynRL's clamp has slope +1.
    _, g_lin = _value_and_grad(get_kl_estimator("k3"), [-12.0], [0.0], [0.0])
    v_clamp, g_clamp = _value_and_grad(k3_clamped, [-12.0], [0.0], [0.0])
    assert float(g_lin) == pytest.approx(1 - math.exp(10))
    assert float(g_clamp) == pytest.approx(1.0)
    assert float(v_clamp) == pytest.approx(-12 + math.exp(10) - 1)
    # Inside ±10 the two are the same function.
    log_r = torch.linspace(-9.5, 9.5, 41, dtype=torch.float64)
    torch.testing.assert_close(k3_clamped(log_r, torch.zeros_like(log_r), log_r), kl_k3(log_r, torch.zeros_like(log_r)))


def test_k3_is_values_and_gradients_by_hand():
    # Anchor = behavior (w_a = 1): K = 1 - r + r·log r, K' = r·log r. r = e, 1/e.
    v, g = _value_and_grad(k3_is, [0.0, -2.0], [-1.0, -1.0], [-1.0, -1.0])
    torch.testing.assert_close(v, torch.tensor([1 - E + E, 1 - 1 / E - 1 / E], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([E, -1 / E], dtype=torch.float64))
    # Anchor ≠ behavior: w_a = π_a/π_b = e^-1, s = πθ/π_a = e^2: K = w_a·(1 - s + s·log s), K' = r·log s, r = e.
    v, g = _value_and_grad(k3_is, [0.0], [-2.0], [-1.0])
    w, s = math.exp(-1), math.exp(2)
    assert float(v) == pytest.approx(w * (1 - s + s * 2))
    assert float(g) == pytest.approx(E * 2)


def test_k3_is_is_nonnegative_bounded_on_rejected_tokens_and_finite_far_out():
    log_r = torch.linspace(-40, 30, 701, dtype=torch.float64)
    v, g = _value_and_grad(k3_is, log_r.tolist(), [0.0] * 701, [0.0] * 701)
    assert bool((v >= -1e-12).all()) and bool(torch.isfinite(v).all()) and bool(torch.isfinite(g).all())
    rejected = log_r < 0
    assert float(g[rejected].abs().max()) <= 1 / E + 1e-9  # |r·log r| ≤ 1/e on r < 1
    assert float(g[log_r < -30].abs().max()) < 1e-11  # vanishes as r → 0
    # k3's pull on the same rejected tokens grows without bound (up to the linear tail's slope).
    _, g_k3 = _value_and_grad(get_kl_estimator("k3"), [-8.0], [0.0], [0.0])
    assert float(g_k3) == pytest.approx(1 - math.exp(8))


def _categorical(seed, n=6):
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(n, generator=gen, dtype=torch.float64) * 1.5, dim=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expectations_under_the_behavior_policy_by_enumeration(seed):
    log_b, log_theta, log_a = _categorical(seed), _categorical(seed + 10), _categorical(seed + 20)
    p_b, p_theta = log_b.exp(), log_theta.exp()
    kl_theta_b = float((p_theta * (log_theta - log_b)).sum())
    kl_theta_a = float((p_theta * (log_theta - log_a)).sum())
    kl_b_theta = float((p_b * (log_b - log_theta)).sum())
    chi2_b_theta = float((p_b * p_b / p_theta).sum() - 1)

    def expect(name, anchor):
        return float((p_b * get_kl_estimator(name)(log_theta, anchor, log_b)).sum())

    # k3_is: exactly the KL the formula writes, toward either anchor.
    assert expect("k3_is", log_b) == pytest.approx(kl_theta_b, rel=1e-10)
    assert expect("k3_is", log_a) == pytest.approx(kl_theta_a, rel=1e-10)
    # k3 on π_b's samples: χ²(π_b ‖ πθ) - KL(π_b ‖ πθ), not KL(πθ ‖ π_b).
    assert expect("k3", log_b) == pytest.approx(chi2_b_theta - kl_b_theta, rel=1e-10)
    assert abs(expect("k3", log_b) - kl_theta_b) > 1e-3


def test_the_estimators_agree_to_first_order_on_policy():
    # Near πθ = π_a = π_b both are ½ l² + O(l³) and their gradients l + O(l²).
    for eps in (1e-2, 1e-3):
        log_r = torch.tensor([eps, -eps], dtype=torch.float64)
        v3, g3 = _value_and_grad(get_kl_estimator("k3"), log_r.tolist(), [0.0, 0.0], [0.0, 0.0])
        vi, gi = _value_and_grad(k3_is, log_r.tolist(), [0.0, 0.0], [0.0, 0.0])
        assert float((v3 - vi).abs().max()) < 2 * eps**3
        assert float((g3 - gi).abs().max()) < 2 * eps**2
        torch.testing.assert_close(v3, log_r * log_r / 2, rtol=0, atol=eps**3)


def _loss(name, logp, behavior, adv, old=None, other_rows=None, **settings):
    spec = get_loss(name)
    mask = torch.ones_like(logp, dtype=torch.bool)
    inputs = LossInputs(logp, behavior, adv, mask, old_logprobs=old, other_model_rows=other_rows)
    out = spec.fn(inputs, spec.make_settings(settings))
    out.loss.backward()
    return out


def test_p3o_with_k3_is_gradient_by_hand():
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    l_b = torch.tensor([[0.5, 0.0, -1.0]])
    logp = (behavior + l_b).requires_grad_(True)
    out = _loss("p3o", logp, behavior, torch.tensor([2.0]), kl_estimator="k3_is")
    r = torch.exp(l_b)
    ess = float(r.sum() ** 2 / (3 * (r**2).sum()))
    hand = (-torch.minimum(r, torch.tensor(ess)) * 2.0 + (1 - ess) * r * l_b) / 3
    torch.testing.assert_close(logp.grad, hand)
    assert float(out.metrics["kl_behavior"]) == pytest.approx(float((1 - r + r * l_b).mean()), rel=1e-5)


def test_p3o_proximal_anchor_pulls_toward_pi_old_at_the_behavior_ess():
    behavior = torch.tensor([[-1.0, -0.5, -0.2]])
    l_b = torch.tensor([[0.5, 0.0, -1.0]])
    logp = (behavior + l_b).requires_grad_(True)
    old = logp.detach() - torch.tensor([[0.2, -0.1, 0.3]])
    _loss("p3o", logp, behavior, torch.tensor([2.0]), old=old, kl_estimator="k3_is", kl_anchor="proximal")
    r = torch.exp(l_b)
    ess = float(r.sum() ** 2 / (3 * (r**2).sum()))
    log_s = logp.detach() - old
    hand = (-torch.minimum(r, torch.tensor(ess)) * 2.0 + (1 - ess) * r * log_s) / 3  # ∂K/∂logπθ = r·log s
    torch.testing.assert_close(logp.grad, hand)


def test_auto_anchor_is_pi_b_on_the_policys_rows_and_pi_old_on_another_models():
    """kl_anchor="auto": row 0 is the policy's own (stale) row, row 1 another model's. Each row's gradient is the
    one its anchor gives alone (the ESS is the batch's either way), and without such rows it is the behavior anchor."""
    behavior = torch.tensor([[-1.0, -0.5], [-0.2, -2.0]])
    shift = torch.tensor([[0.5, -0.3], [-1.0, 0.4]])
    old_shift = torch.tensor([[0.2, -0.1], [0.3, 0.1]])
    adv = torch.tensor([1.0, -2.0])

    def grad(anchor, other_rows=None):
        logp = (behavior + shift).requires_grad_(True)
        old = logp.detach() - old_shift
        # The paper's weight on every row, so that only the anchor differs (`other_model_weight` has its own test).
        settings = dict(kl_estimator="k3_is", kl_anchor=anchor, other_model_weight="ess_cap")
        _loss("p3o", logp, behavior, adv, old=old, other_rows=other_rows, **settings)
        return logp.grad

    auto = grad("auto", torch.tensor([False, True]))
    torch.testing.assert_close(auto[0], grad("behavior")[0])
    torch.testing.assert_close(auto[1], grad("proximal")[1])
    assert not torch.allclose(grad("behavior")[1], grad("proximal")[1])  # the two anchors do differ on that row
    torch.testing.assert_close(grad("auto"), grad("behavior"))  # no other model's rows: π_b everywhere
    torch.testing.assert_close(grad("auto", torch.tensor([False, False])), grad("behavior"))
    assert get_loss("p3o").uses_old_logprobs(get_loss("p3o").make_settings({"kl_anchor": "auto"}))


def test_other_model_source_ids_are_the_behavior_models_live_and_recorded():
    from rllib_p3o.core.sources import (
        POLICY,
        is_other_model_id,
        offline_source_name,
        other_model_source_ids,
        source_id,
    )

    ids = other_model_source_ids([{"model": "/models/weak-1b"}, {"model": "/m/x", "name": "judge"}])
    expected = {"behavior/weak-1b", "behavior/judge", "offline/behavior/weak-1b", "offline/behavior/judge"}
    assert ids == sorted(source_id(n) for n in expected)
    assert all(is_other_model_id(i) for i in ids)
    # Another model's recording, whatever source its rows were recorded under, is that model's data.
    assert offline_source_name(POLICY, recorder="weak-1b") == "offline/behavior/weak-1b"
    assert is_other_model_id(source_id(offline_source_name(POLICY, recorder="weak-1b")))
    own = [POLICY, offline_source_name(POLICY), offline_source_name(None), offline_source_name("policy")]
    assert not {source_id(n) for n in own} & set(ids)
    assert not any(is_other_model_id(source_id(n)) for n in own)
    assert all(0 <= source_id(n) < 2**31 for n in own + list(expected))
    assert other_model_source_ids([]) == []


def test_diagnostics_kl_grad_share_and_rejected_fraction():
    behavior = torch.zeros(1, 4)
    logp = torch.tensor([[0.0, 0.0, -12.0, -11.0]], requires_grad=True)  # two tokens the learner has rejected
    adv = torch.tensor([1.0])
    _, m_k3 = p3o_loss(logp, behavior, adv, torch.ones(1, 4, dtype=torch.bool), kl_estimator="k3")
    _, m_is = p3o_loss(logp, behavior, adv, torch.ones(1, 4, dtype=torch.bool), kl_estimator="k3_is")
    assert float(m_k3["rejected_fraction"]) == pytest.approx(0.5)
    # k3 on the rejected tokens: (1 - ESS)·(1 - e^10+) dwarfs the policy gradient; k3_is weighs them by ≤ 1/e.
    assert float(m_k3["kl_grad_share"]) > 0.99
    assert float(m_is["kl_grad_share"]) < 0.3
    _, m_fresh = p3o_loss(behavior.clone().requires_grad_(True), behavior, adv, torch.ones(1, 4, dtype=torch.bool))
    assert float(m_fresh["kl_grad_share"]) == 0.0 and float(m_fresh["rejected_fraction"]) == 0.0


def test_settings_validated_through_the_config():
    # The defaults the claims bench chose (its development set: the trust region and ESS per version); the paper's
    # reference implementation is one setting away (loss="p3o_reference").
    default = P3OConfig().training(loss="p3o")
    assert default.loss_settings() == P3OLossSettings(
        kl_estimator="k3_is", kl_anchor="auto", trust_region="ess_clip", ess_scope="version"
    )
    from rllib_p3o.sweep.grid import DEFAULT_METHOD, METHODS

    chosen = METHODS[DEFAULT_METHOD]  # the bench's name for the default computes with the defaults
    assert get_loss(chosen["loss"]).make_settings(chosen["loss_config"]) == default.loss_settings()
    settings = P3OConfig().training(loss="p3o", loss_config={"kl_estimator": "k3_clamped", "kl_anchor": "behavior"})
    assert (settings.loss_settings().kl_estimator, settings.loss_settings().kl_anchor) == ("k3_clamped", "behavior")
    with pytest.raises(ValueError, match="kl_estimator must be one of k3, k3_clamped, k3_is, got 'k4'"):
        P3OConfig().training(model="/m", loss="p3o", loss_config={"kl_estimator": "k4"}).validate()
    with pytest.raises(ValueError, match="kl_anchor must be one of behavior, proximal, auto"):
        P3OConfig().training(model="/m", loss="p3o_no_cap", loss_config={"kl_anchor": "ref"}).validate()
    with pytest.raises(ValueError, match="loss 'p3o_no_kl' has no setting 'kl_estimator'"):
        P3OConfig().training(model="/m", loss="p3o_no_kl", loss_config={"kl_estimator": "k3"}).validate()


def test_kl_anchor_none_is_p3o_without_its_kl_term_and_keeps_the_trust_region():
    """``kl_anchor="none"`` drops the KL term: with no trust region it is `p3o_no_kl` exactly, with one it is the same
    capped policy gradient with the trust region's mask (the ablation of offline_weaker: which term holds P3O back)."""

    g = torch.Generator().manual_seed(3)
    behavior = -torch.rand(4, 5, generator=g) * 2
    shift = 0.6 * torch.randn(4, 5, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.ones(4, 5, dtype=torch.bool)
    lagging = torch.ones(4, dtype=torch.bool)

    def grad(loss: str, loss_config: dict):
        logp = (behavior + shift).requires_grad_(True)
        spec = get_loss(loss)
        out = spec.fn(LossInputs(logp, behavior, adv, mask, lagging=lagging), spec.make_settings(loss_config))
        out.loss.backward()
        return float(out.loss), logp.grad, out.metrics

    none = grad("p3o", {"kl_anchor": "none", "trust_region": "none"})
    no_kl = grad("p3o_no_kl", {})
    assert none[0] == pytest.approx(no_kl[0])
    torch.testing.assert_close(none[1], no_kl[1])
    with_kl = grad("p3o", {"kl_anchor": "behavior", "trust_region": "none"})
    assert not torch.allclose(with_kl[1], none[1])  # the KL term does act on these ratios
    clipped = grad("p3o", {"kl_anchor": "none", "trust_region": "ess_clip"})
    assert float(clipped[2]["trust_masked_fraction"]) > 0
    masked = clipped[1] == 0
    torch.testing.assert_close(clipped[1][~masked], none[1][~masked])  # unmasked tokens: the same gradient
    assert not get_loss("p3o").uses_old_logprobs(get_loss("p3o").make_settings({"kl_anchor": "none"}))
