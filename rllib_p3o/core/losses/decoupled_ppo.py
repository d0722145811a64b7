"""Decoupled PPO, AReaL's form (Fu et al. 2025, "AReaL", arXiv 2505.24298; Hilton et al. 2021): the PPO clip acts on
the update against a proximal policy, the learner's own weights before the update, and the behavior policy enters
only through an importance weight, with tokens whose weight is too large left out.

With ``π_prox`` the learner's policy before this update (``old_logprobs``, recomputed), ``ρ_t = πθ/π_prox`` and
``w_t = π_prox/π_b`` (no gradient)::

    ℓ_t = -1[w_t ≤ C] · w_t · min(ρ_t·A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high)·A_t)
    L = (1/N) Σ_t ℓ_t,   N = all valid tokens (AReaL keeps the unmasked count)

C is AReaL's ``behav_imp_weight_cap`` (token mask mode); ``C = 0`` turns the mask off. With one optimizer step per
batch ``ρ = 1`` and the clip is inert: the loss is then the importance-weighted policy gradient with ``w = π_old/π_b``.
`rllib_p3o.core.losses.decoupled_grpo`'s ``grpo_tis`` is the same with the weight truncated at C instead of masked.
Metrics as ``grpo_tis``'s, plus ``behavior_masked_fraction``.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, token_mean
from rllib_p3o.core.losses.grpo import GRPOSettings
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import diagnostics, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, OldLogprobs, output, register_loss
from rllib_p3o.core.losses.trust_region import masked_share


@dataclasses.dataclass(frozen=True)
class DecoupledPPOSettings(GRPOSettings):
    """PPO's clip range on ``πθ/π_prox``, and C: tokens whose ``π_prox/π_b`` exceeds it are left out (AReaL's
    ``behav_imp_weight_cap``, 5.0 in its asynchronous examples; 0 = no mask)."""

    behavior_weight_cap: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.behavior_weight_cap == 0.0 or self.behavior_weight_cap >= 1.0):
            raise ValueError(f"behavior_weight_cap must be 0 (off) or >= 1, got {self.behavior_weight_cap}")


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    behavior_weight_cap: float = 5.0,
    ref_logprobs=None,
    kl_ref_coeff: float = 0.0,
    entropy=None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """Decoupled PPO (module docstring): ``ℓ_t = -1[w ≤ C]·w·min(ρA, clip(ρ)A)``, token-mean over all valid tokens."""
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    proximal = torch.where(mask, proximal_logprobs.to(logprobs.dtype), logprobs.detach())
    stats = log_ratio_stats(logprobs - behavior, mask)
    n_global = stats["n"].clamp(min=1.0)
    with torch.no_grad():
        weight = torch.exp(proximal - behavior)
        kept = mask & (weight <= behavior_weight_cap) if behavior_weight_cap else mask
    ratio = torch.exp(logprobs - proximal)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_loss = token_mean(-weight * torch.minimum(unclipped, clipped), kept, n_global)
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss
    extra = dict(extra, clip_fraction=(clipped < unclipped).to(torch.float64), is_weight_mean=weight)
    metrics = diagnostics(
        logprobs - behavior, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra
    )
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    metrics.update(behavior_masked_fraction=masked_share(mask & ~kept, mask))
    return loss, metrics


@register_loss("decoupled_ppo", settings=DecoupledPPOSettings, old_logprobs=OldLogprobs.ALWAYS)
def decoupled_ppo(inputs: LossInputs, settings: DecoupledPPOSettings) -> LossOutput:
    """``ℓ_t = -1[w_t ≤ C]·w_t·min(ρ_t·A_t, clip(ρ_t, 1-ε_low, 1+ε_high)·A_t)``, ``ρ = πθ/π_prox``, ``w = π_prox/π_b``."""
    loss, metrics = decoupled_ppo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), clip_low=settings.clip_low, clip_high=settings.clip_high,
        behavior_weight_cap=settings.behavior_weight_cap,
    )  # fmt: skip
    return output(loss, metrics)
