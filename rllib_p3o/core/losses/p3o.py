"""P3O and its two ablations (the math: `rllib_p3o.core.objectives.p3o_loss`, the KL estimators:
`rllib_p3o.core.kl_estimators`). P3O has no coefficients: the ESS of the batch takes the place of a clip range and a
KL coefficient. Its settings say only *which* KL the trust-region term estimates, and toward which policy."""

import dataclasses
from typing import Optional

import torch

from rllib_p3o.core import objectives
from rllib_p3o.core.kl_estimators import KL_ESTIMATORS
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, NoSettings, output, register_loss
from rllib_p3o.core.objectives import p3o_loss

# The anchors of P3O's KL term: the policy that sampled the token (the paper's), the learner's weights at the start
# of the iteration (π_old, recomputed by the learner with one forward pass per update), or per row: π_b where π_b is
# this policy at some version (its own rows, fresh, stale or replayed) and π_old where another model wrote the row.
KL_ANCHORS = ("behavior", "proximal", "auto")
# The paper's reference implementation (FeynRL `algs/P3O/p3o.py`): k3 with its exponent clamped, toward π_b.
REFERENCE_KL_ESTIMATOR = "k3_clamped"
REFERENCE_KL_ANCHOR = "behavior"
# The defaults, chosen on the claims bench (docs/results/claims.md): the plain k3 on π_b's samples estimates a
# mass-covering divergence that pulls the learner toward a weaker behavior model's tokens; k3_is estimates the
# KL(πθ ‖ π_a) the formula writes. Toward the policy's own earlier versions the KL is a trust region (it holds stale
# async rows back); toward another model it is imitation, so "auto" anchors those rows at π_old instead.
DEFAULT_KL_ESTIMATOR = "k3_is"
DEFAULT_KL_ANCHOR = "auto"
# The trust region on lagging tokens (`rllib_p3o.core.objectives.TRUST_REGIONS`): "none" is the paper's.
TRUST_REGIONS = objectives.TRUST_REGIONS
DEFAULT_TRUST_REGION = "none"


@dataclasses.dataclass(frozen=True)
class P3OSettings:
    """Which KL the term ``(1 - ESS)·KL(πθ ‖ π_a)`` estimates from the batch's tokens (sampled by π_b).

    ``kl_estimator``: ``"k3_is"`` (the default: ``w_a·(1 - s + s·log s)``, an unbiased estimate of
    ``KL(πθ ‖ π_a)`` under π_b's samples), ``"k3"`` (``l + exp(-l) - 1`` of ``l = logπθ - logπ_a``, tails past
    |l| = 10 continued linearly) or ``"k3_clamped"`` (the paper's reference implementation, exactly: the exponent
    clamped to ±10); see `rllib_p3o.core.kl_estimators`. ``kl_anchor``: ``"auto"`` (the default: π_a = π_b on the
    policy's own rows, fresh, stale or replayed, and π_old on rows another model wrote; π_old is computed only for
    batches that hold such rows), ``"behavior"`` (π_a = π_b everywhere, the paper's) or ``"proximal"`` (π_a = π_old,
    the learner's weights at the start of the iteration, everywhere; one forward pass per update). The paper's
    reference implementation is ``kl_estimator="k3_clamped", kl_anchor="behavior"`` with ``ess_scope="batch"``.

    ``trust_region``: what bounds the policy-gradient term on *lagging* tokens, the policy's own tokens sampled by
    weights the learner has moved from since (stale async rows, every optimizer step after a batch's first, offline
    data): ``"none"`` (the paper's: only the cap), ``"ess_clip"`` (no gradient on a lagging token whose ratio is
    outside ``1 ± sqrt(1/ESS - 1)`` on the side its advantage pushes toward: one coefficient of variation of its ESS
    group's ratios) or ``"ess_band"`` (the same with the band ``[ESS, 1/ESS]``); see `p3o_loss`."""

    kl_estimator: str = DEFAULT_KL_ESTIMATOR
    kl_anchor: str = DEFAULT_KL_ANCHOR
    trust_region: str = DEFAULT_TRUST_REGION

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if self.kl_anchor not in KL_ANCHORS:
            raise ValueError(f"kl_anchor must be one of {', '.join(KL_ANCHORS)}, got {self.kl_anchor!r}")
        if self.trust_region not in TRUST_REGIONS:
            raise ValueError(f"trust_region must be one of {', '.join(TRUST_REGIONS)}, got {self.trust_region!r}")


def _uses_proximal_anchor(settings: P3OSettings) -> bool:
    return settings.kl_anchor in ("proximal", "auto")


def kl_anchor_logprobs(inputs: LossInputs, settings: P3OSettings) -> Optional[torch.Tensor]:
    """log π_a of the KL term where it is not π_b (None: π_b everywhere). ``"proximal"``: π_old. ``"auto"``: π_old
    on the rows another model wrote (``inputs.other_model_rows``), π_b on the policy's own."""
    if settings.kl_anchor == "behavior":
        return None
    if settings.kl_anchor == "proximal":
        return inputs.old_logprobs
    rows = inputs.other_model_rows
    if rows is None or inputs.old_logprobs is None or not bool(rows.any()):
        return None
    return torch.where(
        rows.bool().unsqueeze(-1), inputs.old_logprobs.to(inputs.behavior_logprobs.dtype), inputs.behavior_logprobs
    )


def _p3o(inputs: LossInputs, settings: P3OSettings, cap: bool = True, behavior_kl: bool = True) -> LossOutput:
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
        anchor_logprobs=kl_anchor_logprobs(inputs, settings) if behavior_kl else None,
        trust_region=settings.trust_region,
        lagging=inputs.lagging,
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
