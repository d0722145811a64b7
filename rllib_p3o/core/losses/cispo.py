"""CISPO (MiniMax-M1, arXiv 2506.13585): the importance weight is clipped, never the update. Formula, settings and
registration.

    cispo   -sg(clip(r, 1 - ε_low, 1 + ε_high))·logπθ·A        r = πθ/π_b          (clip_low, clip_high)
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, token_mean
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import diagnostics, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, output, register_loss


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
    ε_high (0.28 as Trinity-RFT's default). Token-mean over the global batch; metrics as in `rllib_p3o.core.losses.grpo.grpo_loss`
    (``clip_fraction``: tokens whose weight was clipped).
    """
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    log_ratios = logprobs - behavior
    stats = log_ratio_stats(log_ratios, mask)
    n_global = stats["n"].clamp(min=1.0)
    ratio = torch.exp(log_ratios.detach())
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_loss = token_mean(-weight * logprobs * adv, mask, n_global)
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss
    extra = dict(extra, clip_fraction=(weight != ratio).to(torch.float64))
    metrics = diagnostics(log_ratios, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra)
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class CISPOSettings:
    """The IS weight's clip range [1 - clip_low, 1 + clip_high]; MiniMax-M1 sets no lower bound (clip_low = 1)."""

    clip_low: float = 1.0
    clip_high: float = 0.28

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"clip_low must be in [0, 1], got {self.clip_low}")
        if not self.clip_high >= 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")


@register_loss("cispo", settings=CISPOSettings)
def cispo(inputs: LossInputs, settings: CISPOSettings) -> LossOutput:
    """``ℓ_t = -sg(clip(r_t, 1-ε_low, 1+ε_high)) · logπθ_t · A_t``, ``r_t = πθ/π_b``."""
    loss, metrics = cispo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.advantages, inputs.mask, **inputs.common(),
        clip_low=settings.clip_low, clip_high=settings.clip_high,
    )  # fmt: skip
    return output(loss, metrics)
