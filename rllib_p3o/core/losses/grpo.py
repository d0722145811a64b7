"""GRPO / PPO-clip, the baseline the paper compares P3O against: formula, settings and registration.

grpo   -min(r·A, clip(r, 1 - ε_low, 1 + ε_high)·A)       r = πθ/π_b          (clip_low, clip_high)
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, token_mean
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import diagnostics, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, output, register_loss


def grpo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_ref_coeff: float = 0.0,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """GRPO / PPO-clip baseline with token-mean normalization (the objective the paper compares P3O against).

    Per valid token, with ``r_t = exp(logπθ_t - logπ_b_t)``::

        ℓ_t = -min(r_t · A_t, clip(r_t, 1 - ε_low, 1 + ε_high) · A_t)  +  β_ref · K(logπθ_t - logπ_ref_t)  -  β_ent · H_t

    ``L = (1/N) Σ_t ℓ_t`` over the ``N`` valid tokens of the global batch, as in `rllib_p3o.core.losses.p3o.p3o_loss`. Metrics as in
    `p3o_loss` (``ess`` and ``kl_behavior`` are diagnostics here, not part of the loss) plus ``clip_fraction``,
    the share of tokens whose surrogate was clipped (no gradient).
    """
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    log_ratios = logprobs - behavior
    stats = log_ratio_stats(log_ratios, mask)
    n_global = stats["n"].clamp(min=1.0)

    ratio = torch.exp(log_ratios)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_tok = -torch.minimum(unclipped, clipped)
    pg_loss = token_mean(pg_tok, mask, n_global)
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss

    extra = dict(extra, clip_fraction=(clipped < unclipped).to(torch.float64))
    metrics = diagnostics(log_ratios, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra)
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """``clip(r, 1 - clip_low, 1 + clip_high)``: ε_low and ε_high of the clipped surrogate (DAPO's clip-higher uses
    clip_high > clip_low)."""

    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if not self.clip_high >= 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")


@register_loss("grpo", settings=GRPOSettings)
def grpo(inputs: LossInputs, settings: GRPOSettings) -> LossOutput:
    """``ℓ_t = -min(r_t·A_t, clip(r_t, 1 - ε_low, 1 + ε_high)·A_t)``, token-mean over the global batch."""
    loss, metrics = grpo_loss(
        inputs.logprobs,
        inputs.behavior_logprobs,
        inputs.advantages,
        inputs.mask,
        **inputs.common(),
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
    )
    return output(loss, metrics)
