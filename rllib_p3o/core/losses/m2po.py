"""M2PO (Zheng et al. 2025, "Prosperity before Collapse", arXiv 2510.01161; AReaL's ``m2_threshold``): a policy
gradient on stale data that leaves out only the tokens with the largest squared log-ratio, a bound on the second
moment of the importance weights instead of a clip range.

With ``r_t = exp(logπθ_t - logπ_b_t)`` and ``M2_t = (log r_t)²`` over the valid tokens of the global batch::

    m_t = 1 for the tokens kept by `rllib_p3o.core.losses.trust_region.second_moment_mask` (mean M2 of the kept < τ)
    ℓ_t = -m_t · r_t · A_t                    L = (1/N) Σ_t ℓ_t,  N = all valid tokens (masked ones included)

The gradient of a kept token is ``r_t·A_t·∇logπθ_t``: the importance-weighted policy gradient, unclipped. The mask
is taken from the ratios as they stand at the step (with one optimizer step per batch, π_old = πθ, so this is the
``log(π_old/π_b)`` AReaL masks on); as AReaL does, the token count that normalizes the loss is that of all valid
tokens, so masking a token removes its term without enlarging the others. τ = 0.04 is the paper's and AReaL's.
Metrics as `rllib_p3o.core.losses.grpo.grpo_loss`'s, plus ``m2`` (mean M2 before the mask) and
``m2_masked_fraction``.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, reduce_across_learners, token_mean
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import diagnostics, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, output, register_loss
from rllib_p3o.core.losses.trust_region import masked_share, second_moment_mask


@dataclasses.dataclass(frozen=True)
class M2POSettings:
    """τ of the second-moment bound: the mean squared log-ratio the kept tokens may have (0.04 in the paper)."""

    m2_threshold: float = 0.04

    def __post_init__(self) -> None:
        if not self.m2_threshold > 0.0:
            raise ValueError(f"m2_threshold must be > 0, got {self.m2_threshold}")


def m2po_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    m2_threshold: float = 0.04,
    ref_logprobs=None,
    kl_ref_coeff: float = 0.0,
    entropy=None,
    entropy_coeff: float = 0.0,
) -> Tuple[torch.Tensor, Metrics]:
    """M2PO's loss (module docstring): ``ℓ_t = -m_t · r_t · A_t``, token-mean over all valid tokens."""
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    log_ratios = logprobs - behavior
    stats = log_ratio_stats(log_ratios, mask)
    n_global = stats["n"].clamp(min=1.0)
    keep = second_moment_mask(log_ratios, mask, m2_threshold)
    ratio = torch.exp(log_ratios)
    pg_loss = token_mean(-ratio * adv, keep, n_global)
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss
    with torch.no_grad():
        m2 = reduce_across_learners(
            torch.where(
                mask, log_ratios.detach().double() ** 2, torch.zeros((), dtype=torch.float64, device=mask.device)
            )
            .sum()
            .reshape(1)
        )[0]
    metrics = diagnostics(log_ratios, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra)
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    metrics.update(m2=(m2 / n_global).to(torch.float32), m2_masked_fraction=masked_share(mask & ~keep, mask))
    return loss, metrics


@register_loss("m2po", settings=M2POSettings)
def m2po(inputs: LossInputs, settings: M2POSettings) -> LossOutput:
    """``ℓ_t = -m_t·r_t·A_t``, ``m`` M2PO's second-moment mask (mean ``(log r)²`` of the kept tokens < τ)."""
    loss, metrics = m2po_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.advantages, inputs.mask, **inputs.common(),
        m2_threshold=settings.m2_threshold,
    )  # fmt: skip
    return output(loss, metrics)
