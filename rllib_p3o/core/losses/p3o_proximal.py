"""P3O with a proximal snapshot: FeynRL's P4O (``algs/P4O/p4o.py``), term for term. Formula, settings and
registration.

    p3o_proximal   -sg(min(r, c))·logπθ·A + (1 - c)·K(πθ, π_mix),   c = min(ESS_b, ESS_p)

Needs π_old, which the learner recomputes once per update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, token_mean
from rllib_p3o.core.losses.kl_estimators import KL_ESTIMATORS, get_kl_estimator
from rllib_p3o.core.losses.parts import diagnostics, gradient_shares, loss_metrics, prepare, regularizers
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, OldLogprobs, output, register_loss

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

    ``K`` is the per-token estimator ``kl_estimator`` of ``KL(πθ ‖ π_m)`` (`rllib_p3o.core.losses.kl_estimators`; P4O's own
    is ``"k3_clamped"``, the default here). On the first minibatch of an iteration πθ = π_old, so ESS_p = 1 and the
    loss is P3O's with the anchor π_b; with one optimizer step per batch it stays that. Metrics as in `rllib_p3o.core.losses.p3o.p3o_loss`,
    plus ``ess_proximal`` (ESS_p), ``cap`` (c) and ``mix_weight_behavior`` (w_b / (w_b + w_p), 0 when both are 0).
    """
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    old = torch.where(mask, old_logprobs.to(logprobs.dtype), logprobs.detach())
    log_ratios = logprobs - behavior
    stats = log_ratio_stats(log_ratios, mask)
    ess_behavior = stats["ess"]
    ess_proximal = log_ratio_stats(logprobs - old, mask)["ess"]
    cap = torch.minimum(ess_behavior, ess_proximal).to(logprobs.dtype)
    n_global = stats["n"].clamp(min=1.0)

    ratio = torch.exp(log_ratios.detach())
    pg_coeff = -torch.minimum(ratio, cap) * adv
    pg_loss = token_mean(pg_coeff * logprobs, mask, n_global)
    estimator = get_kl_estimator(kl_estimator)
    gated = float(1.0 - cap) > PROXIMAL_KL_GATE
    anchor = proximal_mixture_logprobs(behavior, old, ess_behavior, ess_proximal) if gated else behavior
    kl_tok = estimator(logprobs, anchor, behavior)
    kl_loss = (1.0 - cap) * token_mean(kl_tok, mask, n_global) if gated else 0.0
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + kl_loss + reg_loss

    kl_weight = (1.0 - cap).expand_as(logprobs) if gated else torch.zeros_like(logprobs)
    extra = dict(extra, kl_weight=kl_weight)
    metrics = diagnostics(log_ratios, mask, kl_tok, n_global, cap=cap.expand_as(logprobs), extra=extra)
    metrics.update(gradient_shares(logprobs, pg_coeff, kl_weight, estimator, anchor, behavior, mask))
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    w_b, w_p = (1.0 - ess_behavior).clamp(min=0.0), (1.0 - ess_proximal).clamp(min=0.0)
    mix_b = w_b / (w_b + w_p) if float(w_b + w_p) > 0 else torch.zeros_like(w_b)
    metrics.update(
        ess_proximal=ess_proximal.to(torch.float32),
        cap=cap.detach().to(torch.float32),
        mix_weight_behavior=mix_b.to(torch.float32),
    )
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class P3OProximalSettings:
    """The per-token KL estimator of the term toward the adaptive mixture (`rllib_p3o.core.losses.kl_estimators`); FeynRL's
    P4O uses ``"k3_clamped"``, the default here, so that the reference is reproduced as it is."""

    kl_estimator: str = "k3_clamped"

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")


@register_loss(
    "p3o_proximal", settings=P3OProximalSettings, old_logprobs=OldLogprobs.ALWAYS, needs_untruncated_sampling=True
)
def p3o_proximal(inputs: LossInputs, settings: P3OProximalSettings) -> LossOutput:
    """FeynRL's P4O: ``-sg(min(r, c))·logπθ·A + (1-c)·K(πθ, π_m; π_b)``, c = min(ESS_b, ESS_p), π_m the mixture of
    π_b and π_old weighted by 1 - ESS_b and 1 - ESS_p."""
    loss, metrics = p3o_proximal_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), kl_estimator=settings.kl_estimator,
    )  # fmt: skip
    return output(loss, metrics)
