"""P3O and its two ablations (the math: `rllib_p3o.core.objectives.p3o_loss`, the KL estimators:
`rllib_p3o.core.kl_estimators`). P3O has no coefficients: the ESS of the batch takes the place of a clip range and a
KL coefficient. Its settings say only *which* KL the trust-region term estimates, and toward which policy."""

import dataclasses

from rllib_p3o.core.kl_estimators import KL_ESTIMATORS
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, NoSettings, output, register_loss
from rllib_p3o.core.objectives import p3o_loss

# The anchors of P3O's KL term: the policy that sampled the token (the paper's), or the learner's weights at the
# start of the iteration (π_old, recomputed by the learner with one forward pass per update).
KL_ANCHORS = ("behavior", "proximal")
# The paper's reference implementation (FeynRL `algs/P3O/p3o.py`) uses k3 with its exponent clamped.
REFERENCE_KL_ESTIMATOR = "k3_clamped"
DEFAULT_KL_ESTIMATOR = "k3"


@dataclasses.dataclass(frozen=True)
class P3OSettings:
    """Which KL the term ``(1 - ESS)·KL(πθ ‖ π_a)`` estimates from the batch's tokens (sampled by π_b).

    ``kl_estimator``: ``"k3"`` (``l + exp(-l) - 1`` of ``l = logπθ - logπ_a``, tails past |l| = 10 continued
    linearly), ``"k3_clamped"`` (the paper's reference implementation, exactly: the exponent clamped to ±10) or
    ``"k3_is"`` (``w_a·(1 - s + s·log s)``, an unbiased estimate of ``KL(πθ ‖ π_a)`` under π_b's samples; see
    `rllib_p3o.core.kl_estimators`). ``kl_anchor``: ``"behavior"`` (π_a = π_b, the paper's) or ``"proximal"``
    (π_a = the learner's weights at the start of the iteration; costs one forward pass per update)."""

    kl_estimator: str = DEFAULT_KL_ESTIMATOR
    kl_anchor: str = "behavior"

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if self.kl_anchor not in KL_ANCHORS:
            raise ValueError(f"kl_anchor must be one of {', '.join(KL_ANCHORS)}, got {self.kl_anchor!r}")


def _uses_proximal_anchor(settings: P3OSettings) -> bool:
    return settings.kl_anchor == "proximal"


def _p3o(inputs: LossInputs, settings: P3OSettings, cap: bool = True, behavior_kl: bool = True) -> LossOutput:
    proximal = behavior_kl and settings.kl_anchor == "proximal"
    loss, metrics = p3o_loss(
        inputs.logprobs,
        inputs.behavior_logprobs,
        inputs.advantages,
        inputs.mask,
        **inputs.common(),
        ess_groups=inputs.ess_groups,
        num_ess_groups=inputs.num_ess_groups,
        cap=cap,
        behavior_kl=behavior_kl,
        kl_estimator=settings.kl_estimator,
        anchor_logprobs=inputs.old_logprobs if proximal else None,
    )
    return output(loss, metrics)


# How the P3O losses with a KL term register: their settings, ESS per source, π_old only for the proximal anchor.
_WITH_KL = dict(
    settings=P3OSettings, ess_scoped=True, needs_old_logprobs=_uses_proximal_anchor, needs_untruncated_sampling=True
)


@register_loss("p3o", **_WITH_KL)
def p3o(inputs: LossInputs, settings: P3OSettings) -> LossOutput:
    """``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t + (1 - ESS)·K(πθ, π_a; π_b)_t``: the paper's objective, with the
    KL estimator ``K`` and anchor ``π_a`` of `P3OSettings`."""
    return _p3o(inputs, settings)


@register_loss("p3o_no_cap", **_WITH_KL)
def p3o_no_cap(inputs: LossInputs, settings: P3OSettings) -> LossOutput:
    """Ablation of P3O without the cap: ``ℓ_t = -sg(r_t)·logπθ_t·A_t + (1 - ESS)·K(πθ, π_a; π_b)_t``.

    Plain importance-weighted REINFORCE plus P3O's ESS-weighted KL: separates what the cap does from the KL."""
    return _p3o(inputs, settings, cap=False)


@register_loss("p3o_no_kl", ess_scoped=True, needs_untruncated_sampling=True)
def p3o_no_kl(inputs: LossInputs, settings: NoSettings) -> LossOutput:
    """Ablation of P3O without the KL term: ``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t``.

    Only the ESS cap adapts to the batch; nothing pulls the policy toward the behavior policy."""
    return _p3o(inputs, P3OSettings(), behavior_kl=False)
