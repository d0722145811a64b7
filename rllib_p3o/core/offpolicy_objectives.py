"""The corrections peers ship against off-policy rollouts, and P3O's proximal variant, as pure-torch functions.

Three policies appear here. ``π_b`` (``behavior_logprobs``) sampled the tokens: the rollout engine, an older
checkpoint or another model. ``π_old`` (``old_logprobs``) is the learner's policy before this iteration's update,
recomputed by the learner with one forward pass (verl's "decoupled" mode). ``πθ`` (``logprobs``) is the policy being
trained. With ``π_old`` the PPO/GRPO clip acts on the learner's own update, ``πθ/π_old``, and the engine mismatch
``π_old/π_b`` is corrected separately, by a weight or a mask.

Shapes, masks, the distributed contract (every statistic all-reduced, each rank returns its share of the global
token-mean) and the metrics are as in `rllib_p3o.core.objectives`. Each function returns ``(loss, metrics)`` with
``ess`` the ESS of ``πθ/π_b`` (a diagnostic where the loss does not use it).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from rllib_p3o.core.kl_estimators import get_kl_estimator
from rllib_p3o.core.objectives import (
    Metrics,
    _all_reduce,
    _diagnostics,
    _gradient_shares,
    _log_ratio_stats,
    _loss_metrics,
    _prepare,
    _regularizers,
    _token_mean,
    kl_k3,
)


def truncated_is_weights(old_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights for the engine mismatch: ``w_t = min(π_old(y_t) / π_b(y_t), C)``, no gradient.

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"; verl's token-level
    ``rollout_is`` with ``rollout_is_threshold`` C (default 2.0).
    """
    with torch.no_grad():
        return torch.exp((old_logprobs - behavior_logprobs).clamp(max=math.log(cap)))


def geometric_sequence_mask(
    old_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Rows to keep: ``low <= exp(mean_t log(π_old(y_t) / π_b(y_t))) <= high`` over each row's valid tokens.

    The per-sequence geometric mean of the engine-mismatch ratio (verl's ``rollout_rs="geometric"``, band
    [0.999, 1.001] in its preset; SkyRL's recommended default). A row without valid tokens is kept (it adds nothing).
    Returns a ``[B]`` bool tensor, no gradient.
    """
    with torch.no_grad():
        mask = mask.bool()
        log_ratio = torch.where(mask, old_logprobs - behavior_logprobs, torch.zeros_like(old_logprobs))
        n = mask.sum(-1).clamp(min=1)
        geometric = torch.exp(log_ratio.sum(-1) / n)
        return (geometric >= low) & (geometric <= high)


def decoupled_grpo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    tis_cap: Optional[float] = None,
    seq_mask_band: Optional[Tuple[float, float]] = None,
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_ref_coeff: float = 0.0,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """GRPO-clip against the recomputed ``π_old``, with the engine mismatch corrected by a weight or a mask.

    With ``ρ_t = exp(logπθ_t - logπ_old_t)``, per valid token::

        ℓ_t = -w_t · min(ρ_t·A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high)·A_t)

    ``tis_cap`` C: ``w_t = min(π_old/π_b, C)`` (`truncated_is_weights`; the loss ``grpo_tis``).
    ``seq_mask_band`` (lo, hi): ``w_t = 1``, and rows whose geometric-mean ``π_old/π_b`` leaves [lo, hi] are dropped
    from the loss and from its token count (`geometric_sequence_mask`; the loss ``grpo_seq_mask``).
    ``L = (1/N) Σ_t ℓ_t`` over the ``N`` kept valid tokens of the global batch (+ the optional regularizers).

    Metrics as in `grpo_loss` (``ess`` of πθ/π_b), plus ``is_weight_mean``, ``is_truncated_fraction`` (tokens whose
    weight was cut at C) and ``seq_masked_fraction`` (valid tokens in dropped rows).
    """
    mask, behavior, adv = _prepare(logprobs, behavior_logprobs, advantages, mask)
    old = torch.where(mask, old_logprobs.to(logprobs.dtype), logprobs.detach())
    stats = _log_ratio_stats(logprobs - behavior, mask)
    keep = mask
    if seq_mask_band is not None:
        keep = mask & geometric_sequence_mask(old, behavior, mask, *seq_mask_band).unsqueeze(-1)
    n_kept = _all_reduce(keep.sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
    weight = truncated_is_weights(old, behavior, tis_cap) if tis_cap is not None else torch.ones_like(logprobs)

    ratio = torch.exp(logprobs - old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_loss = _token_mean(-weight * torch.minimum(unclipped, clipped), keep, n_kept)
    reg_loss, extra = _regularizers(logprobs, keep, n_kept, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss

    with torch.no_grad():
        truncated = (old - behavior) > math.log(tis_cap) if tis_cap is not None else torch.zeros_like(mask)
        extra = dict(
            extra,
            clip_fraction=(clipped < unclipped).to(torch.float64),
            is_weight_mean=weight,
            is_truncated_fraction=truncated.to(torch.float64),
            seq_masked_fraction=(mask & ~keep).to(torch.float64),
        )
    n_valid = stats["n"].clamp(min=1.0)
    metrics = _diagnostics(
        logprobs - behavior, mask, kl_k3(logprobs.detach(), behavior), n_valid, cap=None, extra=extra
    )
    metrics.update(_loss_metrics(loss, pg_loss, n_valid, stats))
    return loss, metrics


def cispo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_ref_coeff: float = 0.0,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): the importance weight is clipped, never the update.

    With ``r_t = exp(logπθ_t - logπ_b_t)``, per valid token::

        ℓ_t = -sg(clip(r_t, 1 - ε_low, 1 + ε_high)) · logπθ_t · A_t

    Every token keeps a gradient (a clipped PPO term has none). MiniMax-M1 sets no lower bound (ε_low = 1) and tunes
    ε_high (0.28 as Trinity-RFT's default). Token-mean over the global batch; metrics as in `grpo_loss`
    (``clip_fraction``: tokens whose weight was clipped).
    """
    mask, behavior, adv = _prepare(logprobs, behavior_logprobs, advantages, mask)
    log_ratios = logprobs - behavior
    stats = _log_ratio_stats(log_ratios, mask)
    n_global = stats["n"].clamp(min=1.0)
    ratio = torch.exp(log_ratios.detach())
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_loss = _token_mean(-weight * logprobs * adv, mask, n_global)
    reg_loss, extra = _regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss
    extra = dict(extra, clip_fraction=(weight != ratio).to(torch.float64))
    metrics = _diagnostics(log_ratios, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra)
    metrics.update(_loss_metrics(loss, pg_loss, n_global, stats))
    return loss, metrics


# Below this trust-region weight ``1 - c`` the proximal loss skips its KL term (FeynRL P4O's ``eps_gate``).
PROXIMAL_KL_GATE = 1e-6
# Added to a mixture weight before its log, so a weight of exactly 0 drops its policy from the mixture (P4O's).
_LOG_EPS = 1e-30


def proximal_mixture_logprobs(
    behavior_logprobs: torch.Tensor, old_logprobs: torch.Tensor, ess_behavior: torch.Tensor, ess_proximal: torch.Tensor
) -> torch.Tensor:
    """``log π_m`` of the adaptive mixture of FeynRL's P4O, per token, no gradient::

        π_m = (w_b · π_b + w_p · π_old) / (w_b + w_p),   w_b = max(0, 1 - ESS_b),  w_p = max(0, 1 - ESS_p)

    The policy the batch trusts less weighs more: fresh samples (ESS_b = 1) leave only π_old, a first minibatch
    (ESS_p = 1) only π_b. Call only when ``w_b + w_p > 0``.
    """
    w_b = float((1.0 - ess_behavior).clamp(min=0.0))
    w_p = float((1.0 - ess_proximal).clamp(min=0.0))
    parts = torch.stack(
        [math.log(w_b + _LOG_EPS) + behavior_logprobs.detach(), math.log(w_p + _LOG_EPS) + old_logprobs.detach()]
    )
    return torch.logsumexp(parts, dim=0) - math.log(w_b + w_p)


def p3o_proximal_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_estimator: str = "k3_clamped",
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_ref_coeff: float = 0.0,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """P3O with a proximal snapshot: FeynRL's P4O (``algs/P4O/p4o.py``), term for term.

    Two ESS: ``ESS_b`` of ``r_t = πθ/π_b`` (P3O's) and ``ESS_p`` of ``πθ/π_old`` (how far the update has moved from
    the weights it started the iteration with). With ``c = min(ESS_b, ESS_p)`` and the adaptive mixture ``π_m``
    (`proximal_mixture_logprobs`)::

        ℓ_t = -sg(min(r_t, c)) · logπθ_t · A_t  +  (1 - c) · K(πθ, π_m; π_b)_t        (KL term only if 1 - c > 1e-6)

    ``K`` is the per-token estimator ``kl_estimator`` of ``KL(πθ ‖ π_m)`` (`rllib_p3o.core.kl_estimators`; P4O's own
    is ``"k3_clamped"``, the default here). On the first minibatch of an iteration πθ = π_old, so ESS_p = 1 and the
    loss is P3O's with the anchor π_b; with one optimizer step per batch it stays that. Metrics as in `p3o_loss`,
    plus ``ess_proximal`` (ESS_p), ``cap`` (c) and ``mix_weight_behavior`` (w_b / (w_b + w_p), 0 when both are 0).
    """
    mask, behavior, adv = _prepare(logprobs, behavior_logprobs, advantages, mask)
    old = torch.where(mask, old_logprobs.to(logprobs.dtype), logprobs.detach())
    log_ratios = logprobs - behavior
    stats = _log_ratio_stats(log_ratios, mask)
    ess_behavior = stats["ess"]
    ess_proximal = _log_ratio_stats(logprobs - old, mask)["ess"]
    cap = torch.minimum(ess_behavior, ess_proximal).to(logprobs.dtype)
    n_global = stats["n"].clamp(min=1.0)

    ratio = torch.exp(log_ratios.detach())
    pg_coeff = -torch.minimum(ratio, cap) * adv
    pg_loss = _token_mean(pg_coeff * logprobs, mask, n_global)
    estimator = get_kl_estimator(kl_estimator)
    gated = float(1.0 - cap) > PROXIMAL_KL_GATE
    anchor = proximal_mixture_logprobs(behavior, old, ess_behavior, ess_proximal) if gated else behavior
    kl_tok = estimator(logprobs, anchor, behavior)
    kl_loss = (1.0 - cap) * _token_mean(kl_tok, mask, n_global) if gated else 0.0
    reg_loss, extra = _regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + kl_loss + reg_loss

    kl_weight = (1.0 - cap).expand_as(logprobs) if gated else torch.zeros_like(logprobs)
    extra = dict(extra, kl_weight=kl_weight)
    metrics = _diagnostics(log_ratios, mask, kl_tok, n_global, cap=cap.expand_as(logprobs), extra=extra)
    metrics.update(_gradient_shares(logprobs, pg_coeff, kl_weight, estimator, anchor, behavior, mask))
    metrics.update(_loss_metrics(loss, pg_loss, n_global, stats))
    w_b, w_p = (1.0 - ess_behavior).clamp(min=0.0), (1.0 - ess_proximal).clamp(min=0.0)
    mix_b = w_b / (w_b + w_p) if float(w_b + w_p) > 0 else torch.zeros_like(w_b)
    metrics.update(
        ess_proximal=ess_proximal.to(torch.float32),
        cap=cap.detach().to(torch.float32),
        mix_weight_behavior=mix_b.to(torch.float32),
    )
    return loss, metrics


__all__ = [
    "cispo_loss",
    "decoupled_grpo_loss",
    "geometric_sequence_mask",
    "p3o_proximal_loss",
    "proximal_mixture_logprobs",
    "truncated_is_weights",
]
