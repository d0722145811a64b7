"""GRPO-clip against the recomputed π_old with the engine mismatch corrected apart: the baselines peers ship against
off-policy rollouts (verl's "decoupled" mode). Formula, settings and registration.

    grpo_tis       -min(π_old/π_b, C)·min(ρ·A, clip(ρ, 1-ε_low, 1+ε_high)·A),  ρ = πθ/π_old   (truncated IS; tis_cap)
    grpo_seq_mask  the same without weights, sequences outside a geometric-mean band dropped   (seq_mask_low/high)

Both need π_old, which the learner recomputes once per update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, reduce_across_learners, token_mean
from rllib_p3o.core.losses.grpo import GRPOSettings
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import diagnostics, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, OldLogprobs, output, register_loss


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

    Metrics as in `rllib_p3o.core.losses.grpo.grpo_loss` (``ess`` of πθ/π_b), plus ``is_weight_mean``, ``is_truncated_fraction`` (tokens whose
    weight was cut at C) and ``seq_masked_fraction`` (valid tokens in dropped rows).
    """
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    old = torch.where(mask, old_logprobs.to(logprobs.dtype), logprobs.detach())
    stats = log_ratio_stats(logprobs - behavior, mask)
    keep = mask
    if seq_mask_band is not None:
        keep = mask & geometric_sequence_mask(old, behavior, mask, *seq_mask_band).unsqueeze(-1)
    n_kept = reduce_across_learners(keep.sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
    weight = truncated_is_weights(old, behavior, tis_cap) if tis_cap is not None else torch.ones_like(logprobs)

    ratio = torch.exp(logprobs - old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_loss = token_mean(-weight * torch.minimum(unclipped, clipped), keep, n_kept)
    reg_loss, extra = regularizers(logprobs, keep, n_kept, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
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
    metrics = diagnostics(logprobs - behavior, mask, kl_k3(logprobs.detach(), behavior), n_valid, cap=None, extra=extra)
    metrics.update(loss_metrics(loss, pg_loss, n_valid, stats))
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class GRPOTISSettings(GRPOSettings):
    """GRPO's clip range, and C of the truncated importance weight min(π_old/π_b, C) (verl's default 2.0)."""

    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tis_cap >= 1.0:
            raise ValueError(f"tis_cap must be >= 1, got {self.tis_cap}")


@dataclasses.dataclass(frozen=True)
class GRPOSeqMaskSettings(GRPOSettings):
    """GRPO's clip range, and the band of the per-sequence geometric-mean ratio π_old/π_b outside which a sequence
    is dropped (verl's geometric rejection preset: [0.999, 1.001])."""

    seq_mask_low: float = 0.999
    seq_mask_high: float = 1.001

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.seq_mask_low <= 1.0 <= self.seq_mask_high:
            raise ValueError(
                f"need 0 < seq_mask_low <= 1 <= seq_mask_high, got [{self.seq_mask_low}, {self.seq_mask_high}]"
            )


@register_loss("grpo_tis", settings=GRPOTISSettings, old_logprobs=OldLogprobs.ALWAYS)
def grpo_tis(inputs: LossInputs, settings: GRPOTISSettings) -> LossOutput:
    """``ℓ_t = -min(π_old/π_b, C) · min(ρ_t·A_t, clip(ρ_t, 1-ε_low, 1+ε_high)·A_t)``, ``ρ_t = πθ/π_old``."""
    loss, metrics = decoupled_grpo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), clip_low=settings.clip_low, clip_high=settings.clip_high, tis_cap=settings.tis_cap,
    )  # fmt: skip
    return output(loss, metrics)


@register_loss("grpo_seq_mask", settings=GRPOSeqMaskSettings, old_logprobs=OldLogprobs.ALWAYS)
def grpo_seq_mask(inputs: LossInputs, settings: GRPOSeqMaskSettings) -> LossOutput:
    """GRPO-clip against π_old on the sequences whose geometric-mean π_old/π_b lies in the band; others dropped."""
    loss, metrics = decoupled_grpo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), clip_low=settings.clip_low, clip_high=settings.clip_high,
        seq_mask_band=(settings.seq_mask_low, settings.seq_mask_high),
    )  # fmt: skip
    return output(loss, metrics)
