"""P3O, the batch-adaptive objective, its two ablations and the paper's reference form: formula, settings and
registration.

P3O has no coefficients: the ESS of the batch takes the place of a clip range and a KL coefficient. Its settings say
only *which* KL the trust-region term estimates and toward which policy (`rllib_p3o.core.losses.kl_estimators`),
what bounds the policy gradient on lagging tokens (`rllib_p3o.core.losses.trust_region`) and how another model's
tokens are weighted (`other_model_weights`: the paper's cap ``min(r, ESS)`` gives them all nearly one weight; the
default keeps ``r`` truncated at ``1/ESS`` where they are alone in the minibatch and caps it beside the policy's own). What it needs from the
learner: π_old for the KL anchor ``"proximal"`` always, for ``"auto"`` only where another model wrote rows.

    p3o          -sg(min(r, ESS))·logπθ·A + (1 - ESS)·K(πθ, π_a)
    p3o_no_cap   -sg(r)·logπθ·A           + (1 - ESS)·K(πθ, π_a)      (ablation: no ESS cap)
    p3o_no_kl    -sg(min(r, ESS))·logπθ·A                              (ablation: no ESS-weighted KL)
    p3o_reference -sg(min(r, ESS))·logπθ·A + (1 - ESS)·k3_clamped(πθ, π_b)  (the paper's code: one ESS per batch)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist

from rllib_p3o.core.batch_stats import Metrics, distributed, log_ratio_stats, reduce_across_learners, token_mean
from rllib_p3o.core.losses.kl_estimators import KL_ESTIMATORS, get_kl_estimator
from rllib_p3o.core.losses.parts import (
    diagnostics,
    gradient_shares,
    grouped_ess,
    loss_metrics,
    prepare,
    regularizers,
)
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, NoSettings, OldLogprobs, output, register_loss
from rllib_p3o.core.losses.trust_region import TRUST_REGIONS, trust_region_terms

# The anchors of P3O's KL term: the policy that sampled the token (the paper's), the learner's weights at the start
# of the iteration (π_old, recomputed by the learner with one forward pass per update), or per row: π_b where π_b is
# this policy at some version (its own rows, fresh, stale or replayed) and π_old where another model wrote the row;
# or none (no KL term: the ablation that says what the term does, `p3o_no_kl` with a trust region if asked).
KL_ANCHORS = ("behavior", "proximal", "auto", "none")
# The paper's reference implementation (FeynRL `algs/P3O/p3o.py`): k3 with its exponent clamped, toward π_b.
REFERENCE_KL_ESTIMATOR = "k3_clamped"
REFERENCE_KL_ANCHOR = "behavior"
# The defaults, chosen on the claims bench (docs/results/claims.md): the plain k3 on π_b's samples estimates a
# mass-covering divergence that pulls the learner toward a weaker behavior model's tokens; k3_is estimates the
# KL(πθ ‖ π_a) the formula writes. Toward the policy's own earlier versions the KL is a trust region (it holds stale
# async rows back); toward another model it is imitation, so "auto" anchors those rows at π_old instead.
DEFAULT_KL_ESTIMATOR = "k3_is"
DEFAULT_KL_ANCHOR = "auto"
DEFAULT_TRUST_REGION = "ess_clip"  # chosen on the claims bench's development set (docs/results/staleness.md)
# Over which tokens the ESS is taken (`rllib_p3o.learner.row_groups.ess_groups`): the minibatch, each data source of
# it, or each (source, policy version). "version" was chosen with the trust region (docs/results/staleness.md).
ESS_SCOPES = ("batch", "source", "version")
DEFAULT_ESS_SCOPE = "version"
# The policy-gradient weight on the tokens another model wrote (a behavior model's, live or recorded;
# `other_model_weight`), from the ESS of their group: the paper's cap ``min(r, ESS)`` as on every other token, the
# importance weight truncated at ``1/ESS``, or left out above ``1/ESS`` (AReaL's behavior-weight mask with the cap the
# batch's spread gives instead of a coefficient). ``1/ESS`` is the ratios' second moment over their squared mean. The
# last form takes the truncation where another model's tokens are alone in the minibatch (a recording trained alone)
# and the cap where the policy's own tokens are beside them (a live model writing part of each group): on both
# confirmation sets so far the truncation was better alone and the cap better beside the policy's own tokens.
OTHER_MODEL_WEIGHTS = ("ess_cap", "inverse_ess_cap", "inverse_ess_mask", "ess_scaled_mask", "inverse_ess_cap_alone")
ALONE_FORM = "inverse_ess_cap_alone"
# Chosen on the provenance round's development set (docs/results/provenance.md): with "ess_cap" P3O stayed 0.21 below
# decoupled PPO on a weaker model's recording, where the 1/ESS forms tie with it; with the same model live beside the
# policy "ess_cap" is best and the 1/ESS forms are behind. The rule's third choice over its four regimes (each
# candidate best or tied in at most 2, chosen by the mean): the truncation alone, the cap beside the policy's own.
DEFAULT_OTHER_MODEL_WEIGHT = ALONE_FORM


def p3o_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_ref_coeff: float = 0.0,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
    ess_groups: Optional[torch.Tensor] = None,
    num_ess_groups: int = 0,
    cap: bool = True,
    behavior_kl: bool = True,
    kl_estimator: str = DEFAULT_KL_ESTIMATOR,
    anchor_logprobs: Optional[torch.Tensor] = None,
    trust_region: str = DEFAULT_TRUST_REGION,
    lagging: Optional[torch.Tensor] = None,
    other_model_rows: Optional[torch.Tensor] = None,
    other_model_weight: str = DEFAULT_OTHER_MODEL_WEIGHT,
) -> Tuple[torch.Tensor, Metrics]:
    """The batch-adaptive P3O loss (``cap=False`` / ``behavior_kl=False``: its ablations, `rllib_p3o.core.losses`).

    With ``r_t = exp(logπθ_t - logπ_b_t)`` and ``ESS`` the normalized effective sample size of all valid ``r_t`` of
    the global batch (`rllib_p3o.core.batch_stats.effective_sample_size`), per valid token::

        ℓ_t = -sg(clamp(r_t, 0, ESS)) · logπθ_t · A_t  +  (1 - ESS) · K(πθ, π_a; π_b)_t
              + β_ref · k3(logπθ_t - logπ_ref_t)  -  β_ent · H_t

    and ``L = (1/N) Σ_t ℓ_t`` with ``N`` the global number of valid tokens (``sg`` stop-gradient). ``K`` is the
    per-token KL estimator ``kl_estimator`` (`rllib_p3o.core.losses.kl_estimators`: ``"k3"``, ``"k3_clamped"``,
    ``"k3_is"``) of ``KL(πθ ‖ π_a)`` from tokens sampled by π_b; the anchor ``π_a`` is π_b unless
    ``anchor_logprobs`` is given (``kl_anchor="proximal"``: the learner's weights at the start of the iteration;
    ``"auto"``: those on the rows another model wrote, π_b on the others).
    On fresh data ``ESS ≈ 1`` and ``r ≈ 1``: plain REINFORCE with the given advantages. Off-policy data lowers ESS,
    which both caps the importance weights lower and strengthens the pull toward the anchor; the policy gradient
    never vanishes (the weight is ``min(r, ESS) > 0`` for ``r > 0``). ESS carries no gradient.

    ESS scope: by default one ESS for the whole global batch, as above. With ``ess_groups`` (``[B]`` or ``[B, T]``
    ints in ``[0, num_ess_groups)``, the same numbering on every rank) each group ``g`` gets its own ``ESS_g`` over
    its valid tokens of the global batch, and its tokens use ``ESS_g`` for both the cap and the KL weight. The learner
    uses this for ``ess_scope="source"`` (the policy's own rollouts, each behavior model and offline data are then
    trusted by their own mismatch instead of the mixture's) and ``"version"`` (one ESS per source and policy version).

    Trust region (``trust_region``, on the tokens ``lagging`` marks: ``[B]`` or ``[B, T]`` bool, the policy's own
    tokens sampled by weights the policy has moved from since, `rllib_p3o.core.losses.trust_region`)::

        "ess_clip":  m_t = 0 where (A_t > 0 ∧ r_t > 1 + ε_t) ∨ (A_t < 0 ∧ r_t < 1 - ε_t),  ε_t = sqrt(1/ESS_t - 1)
        "ess_band":  the same with the band [ESS_t, 1/ESS_t]
        ℓ_t = -m_t · sg(min(r_t, ESS_t)) · logπθ_t · A_t  +  (1 - ESS_t) · K_t

    Another model's tokens (``other_model_rows``: ``[B]`` bool, the rows a behavior model wrote, live or recorded)
    take the weight ``other_model_weight`` names, with ``ESS_t`` their group's (with ``cap``)::

        "ess_cap":           w_t = min(r_t, ESS_t)                      (the paper's, as every other token)
        "inverse_ess_cap":   w_t = min(r_t, 1/ESS_t)
        "inverse_ess_mask":  w_t = r_t · 1[r_t ≤ 1/ESS_t]
        "ess_scaled_mask":   w_t = ESS_t · r_t · 1[r_t ≤ 1/ESS_t]
        "inverse_ess_cap_alone": w_t = min(r_t, 1/ESS_t) where no valid token of the global minibatch is the
                             policy's own, min(r_t, ESS_t) where some are (`other_models_alone`)

    A lagging token outside the band on the side its advantage pushes toward gets no policy gradient (PPO's clip,
    applied to P3O's detached weight); ``ε_t`` is the coefficient of variation of the ratios of the token's ESS
    group, so the band is the spread the data show, with no coefficient. Fresh tokens (sampled by the current
    weights: their ratios carry only the sampler's mismatch) and other models' tokens are never masked. The KL term
    acts on every token. ``"none"``: ``m_t = 1``. The default is the registered loss's
    (`DEFAULT_TRUST_REGION`); without ``lagging`` no token lags, and every trust region is ``"none"``.

    Returns ``(loss, metrics)`` where loss is this rank's share (see module docstring) and metrics are global
    token-means: ``loss``, ``pg_loss``, ``ess`` (of the whole batch), ``ratio_mean``, ``ratio_max``,
    ``cap_fraction`` (tokens with ``r`` above their cap), ``kl_behavior`` (the KL term's estimator, unweighted),
    ``kl_weight`` (token-mean of ``1 - ESS``), ``kl_grad_share`` and ``rejected_fraction`` (`rllib_p3o.core.losses.parts.gradient_shares`),
    ``num_tokens`` and, when given, ``kl_ref``/``entropy``; with a trust region also ``trust_masked_fraction`` (tokens
    whose policy gradient it removed), ``lagging_fraction`` and ``trust_eps_max`` (the widest band's ε).
    """
    if trust_region not in TRUST_REGIONS:
        raise ValueError(f"trust_region must be one of {', '.join(TRUST_REGIONS)}, got {trust_region!r}")
    mask, behavior, adv = prepare(logprobs, behavior_logprobs, advantages, mask)
    anchor = behavior if anchor_logprobs is None else torch.where(mask, anchor_logprobs.to(logprobs.dtype), behavior)
    log_ratios = logprobs - behavior
    stats = log_ratio_stats(log_ratios, mask)
    ess = stats["ess"]
    n_global = stats["n"].clamp(min=1.0)
    if ess_groups is None:
        ess_tok = ess.to(logprobs.dtype).expand_as(logprobs)
    else:
        ess_tok = grouped_ess(log_ratios, mask, ess_groups, num_ess_groups).to(logprobs.dtype)

    ratio = torch.exp(log_ratios.detach())
    weight = torch.minimum(ratio, ess_tok) if cap else ratio
    # A collective on every learner, whether or not its share of the minibatch holds another model's rows; one
    # process without such rows has nothing to weigh (and no device sync to pay).
    alone = (
        cap
        and other_model_weight == ALONE_FORM
        and (other_model_rows is not None or distributed())
        and other_models_alone(mask, other_model_rows)
    )
    if cap and other_model_rows is not None:
        weight = torch.where(
            other_model_rows.bool().reshape(-1, 1),
            other_model_weights(ratio, ess_tok, other_model_weight, alone=alone),
            weight,
        )
    trust = trust_region_terms(trust_region, ratio, adv, ess_tok, lagging, mask)
    if trust:
        weight = torch.where(trust["masked"], torch.zeros_like(weight), weight)
    pg_tok = -weight * logprobs * adv
    estimator = get_kl_estimator(kl_estimator)
    kl_tok = estimator(logprobs, anchor, behavior)
    kl_weight = (1.0 - ess_tok) if behavior_kl else torch.zeros_like(ess_tok)
    pg_loss = token_mean(pg_tok, mask, n_global)
    kl_loss = token_mean(kl_weight * kl_tok, mask, n_global) if behavior_kl else 0.0
    reg_loss, extra = regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + kl_loss + reg_loss

    extra = dict(extra, kl_weight=kl_weight)
    metrics = diagnostics(log_ratios, mask, kl_tok, n_global, cap=ess_tok, extra=extra)
    metrics.update(gradient_shares(logprobs, -weight * adv, kl_weight, estimator, anchor, behavior, mask))
    metrics.update(loss_metrics(loss, pg_loss, n_global, stats))
    if trust:
        metrics.update(trust["metrics"])
    return loss, metrics


def other_models_alone(mask: torch.Tensor, other_model_rows: Optional[torch.Tensor]) -> bool:
    """Whether no valid token of the global minibatch (every learner's share) is the policy's own: ``mask`` [B, T]
    valid tokens, ``other_model_rows`` [B] another model's rows (None: none on this learner). An all-reduce (max) when
    several learners train, so every learner answers alike."""
    own = mask if other_model_rows is None else mask & ~other_model_rows.bool().reshape(-1, 1)
    flag = own.any().to(torch.float32).reshape(1)
    return not bool(reduce_across_learners(flag, dist.ReduceOp.MAX)[0] > 0)


def other_model_weights(ratio: torch.Tensor, ess: torch.Tensor, form: str, alone: bool = False) -> torch.Tensor:
    """The policy-gradient weight ``w`` of `OTHER_MODEL_WEIGHTS` for ratios ``r`` (detached) with their group's
    ``ESS`` (broadcastable): ``"ess_cap"`` ``min(r, ESS)``; ``"inverse_ess_cap"`` ``min(r, 1/ESS)``;
    ``"inverse_ess_mask"`` ``r·1[r ≤ 1/ESS]``; ``"ess_scaled_mask"`` ``ESS·r·1[r ≤ 1/ESS]`` (the mask's shape, the
    cap's share: the importance weights average about 1 under π_b, so the group's tokens weigh about ESS in all, as
    under the cap, beside the policy's own tokens of weight about 1); ``"inverse_ess_cap_alone"``: ``min(r, 1/ESS)``
    where another model's tokens are ``alone`` in the minibatch, else ``min(r, ESS)``. No gradient."""
    if form not in OTHER_MODEL_WEIGHTS:
        raise ValueError(f"other_model_weight must be one of {', '.join(OTHER_MODEL_WEIGHTS)}, got {form!r}")
    if form == ALONE_FORM:
        form = "inverse_ess_cap" if alone else "ess_cap"
    with torch.no_grad():
        if form == "ess_cap":
            return torch.minimum(ratio, ess)
        inverse = 1.0 / ess.clamp(min=torch.finfo(torch.float32).tiny)
        if form == "inverse_ess_cap":
            return torch.minimum(ratio, inverse)
        masked = torch.where(ratio <= inverse, ratio, torch.zeros_like(ratio))
        return masked * ess if form == "ess_scaled_mask" else masked


@dataclasses.dataclass(frozen=True)
class P3OLossSettings:
    """Which KL the term ``(1 - ESS)·KL(πθ ‖ π_a)`` estimates from the batch's tokens (sampled by π_b).

    ``kl_estimator``: ``"k3_is"`` (the default: ``w_a·(1 - s + s·log s)``, an unbiased estimate of
    ``KL(πθ ‖ π_a)`` under π_b's samples), ``"k3"`` (``l + exp(-l) - 1`` of ``l = logπθ - logπ_a``, tails past
    |l| = 10 continued linearly) or ``"k3_clamped"`` (the paper's reference implementation, exactly: the exponent
    clamped to ±10); see `rllib_p3o.core.losses.kl_estimators`. ``kl_anchor``: ``"auto"`` (the default: π_a = π_b on the
    policy's own rows, fresh, stale or replayed, and π_old on rows another model wrote; π_old is computed only for
    batches that hold such rows), ``"behavior"`` (π_a = π_b everywhere, the paper's) or ``"proximal"`` (π_a = π_old,
    the learner's weights at the start of the iteration, everywhere; one forward pass per update) or ``"none"`` (no
    KL term at all: ``p3o_no_kl``'s objective, with this setting's trust region). The paper's
    reference implementation is ``loss="p3o_reference"`` (``kl_estimator="k3_clamped", kl_anchor="behavior",
    trust_region="none", ess_scope="batch", other_model_weight="ess_cap"``).

    ``trust_region``: what bounds the policy-gradient term on *lagging* tokens, the policy's own tokens sampled by
    weights the learner has moved from since (stale async rows, every optimizer step after a batch's first, offline
    data): ``"ess_clip"`` (the default: no gradient on a lagging token whose ratio is outside ``1 ± sqrt(1/ESS - 1)``
    on the side its advantage pushes toward, one coefficient of variation of its ESS group's ratios), ``"ess_band"``
    (the same with the band ``[ESS, 1/ESS]``) or ``"none"`` (the paper's: only the cap); see `p3o_loss`. Fresh rows
    (on-policy, a batch's first optimizer step) and rows another model wrote are never clipped.

    ``other_model_weight``: the policy-gradient weight on the tokens another model wrote (a behavior model's rows,
    live, or a recording whose provenance is another model's): ``"inverse_ess_cap_alone"`` (the default, chosen on the
    provenance round's development set: ``min(r, 1/ESS)``, the importance weight truncated where the group's own
    spread puts it, where the minibatch holds only another model's tokens, as when a recording trains alone;
    ``min(r, ESS)`` where the policy's own tokens are beside them), ``"inverse_ess_cap"`` (the truncation always),
    ``"inverse_ess_mask"`` (``r`` where ``r ≤ 1/ESS``, no gradient above), ``"ess_scaled_mask"``
    (``ESS·r`` where ``r ≤ 1/ESS``), ``"ess_cap"`` (``min(r, ESS)``, the paper's, as on every other token; best
    with a live second model writing part of each group beside the policy: docs/results/provenance.md). ESS is that
    of the rows' group (``ess_scope``); the policy's own rows are never affected.

    ``ess_scope``: over which tokens the ESS is taken. ``"version"`` (the default, chosen on the claims bench's
    development set): one ESS per data source and policy version of the optimizer step's minibatch across all learners
    (the policy's own rollouts by how many optimizer steps behind their sampling weights are, each behavior model, each
    offline source), so a stale version's rows are capped and pulled by their own mismatch instead of being diluted by
    fresher rows; equal to ``"source"`` where every row of a source is of one version (sync sampling). ``"source"``:
    one ESS per data source; with one source (on-policy or async data alone, one version) it is the paper's ESS.
    ``"batch"`` (the paper's): all valid tokens of the minibatch, one ESS for everything, so a mixture's most
    off-policy part lowers the cap of all of it."""

    kl_estimator: str = DEFAULT_KL_ESTIMATOR
    kl_anchor: str = DEFAULT_KL_ANCHOR
    trust_region: str = DEFAULT_TRUST_REGION
    ess_scope: str = DEFAULT_ESS_SCOPE
    other_model_weight: str = DEFAULT_OTHER_MODEL_WEIGHT

    def __post_init__(self) -> None:
        if self.other_model_weight not in OTHER_MODEL_WEIGHTS:
            raise ValueError(
                f"other_model_weight must be one of {', '.join(OTHER_MODEL_WEIGHTS)}, got {self.other_model_weight!r}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if self.kl_anchor not in KL_ANCHORS:
            raise ValueError(f"kl_anchor must be one of {', '.join(KL_ANCHORS)}, got {self.kl_anchor!r}")
        if self.trust_region not in TRUST_REGIONS:
            raise ValueError(f"trust_region must be one of {', '.join(TRUST_REGIONS)}, got {self.trust_region!r}")
        check_ess_scope(self.ess_scope)


def check_ess_scope(scope: str) -> None:
    """ValueError unless ``scope`` is one of `ESS_SCOPES`."""
    if scope not in ESS_SCOPES:
        raise ValueError(f"ess_scope must be one of {', '.join(ESS_SCOPES)}, got {scope!r}")


@dataclasses.dataclass(frozen=True)
class P3OScopeSettings:
    """The settings of P3O's ablation without a KL term (``p3o_no_kl``): only which tokens its ESS is taken over
    (``ess_scope``, as `P3OLossSettings`')."""

    ess_scope: str = DEFAULT_ESS_SCOPE

    def __post_init__(self) -> None:
        check_ess_scope(self.ess_scope)


def settings_ess_scope(settings: Any) -> str:
    """What an ESS-scoped P3O loss asks of the learner: the ESS groups of its ``ess_scope`` setting."""
    return settings.ess_scope


def old_logprobs_needed(settings: P3OLossSettings) -> OldLogprobs:
    """π_old for the KL anchor: ``"proximal"`` always, ``"auto"`` for batches with another model's rows, else (``"behavior"``,
    ``"none"``) never."""
    return {"proximal": OldLogprobs.ALWAYS, "auto": OldLogprobs.FOR_OTHER_MODEL_ROWS}.get(
        settings.kl_anchor, OldLogprobs.NEVER
    )


def kl_anchor_logprobs(inputs: LossInputs, settings: P3OLossSettings) -> Optional[torch.Tensor]:
    """log π_a of the KL term where it is not π_b (None: π_b everywhere, or no KL term). ``"proximal"``: π_old.
    ``"auto"``: π_old on the rows another model wrote (``inputs.other_model_rows``), π_b on the policy's own."""
    if settings.kl_anchor in ("behavior", "none"):
        return None
    if settings.kl_anchor == "proximal":
        return inputs.old_logprobs
    rows = inputs.other_model_rows
    if rows is None or inputs.old_logprobs is None or not bool(rows.any()):
        return None
    return torch.where(
        rows.bool().unsqueeze(-1), inputs.old_logprobs.to(inputs.behavior_logprobs.dtype), inputs.behavior_logprobs
    )


def _p3o(inputs: LossInputs, settings: P3OLossSettings, cap: bool = True, behavior_kl: bool = True) -> LossOutput:
    behavior_kl = behavior_kl and settings.kl_anchor != "none"
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
        other_model_rows=inputs.other_model_rows,
        other_model_weight=settings.other_model_weight,
    )
    return output(loss, metrics)


# How the P3O losses with a KL term register: their settings, ESS per group, π_old as the KL anchor needs it.
_WITH_KL = dict(
    settings=P3OLossSettings,
    ess_scope=settings_ess_scope,
    old_logprobs=old_logprobs_needed,
    needs_untruncated_sampling=True,
)


@register_loss("p3o", **_WITH_KL)
def p3o(inputs: LossInputs, settings: P3OLossSettings) -> LossOutput:
    """``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t + (1 - ESS)·K(πθ, π_a; π_b)_t``: the paper's objective, with the
    KL estimator ``K`` and anchor ``π_a`` of `P3OLossSettings`."""
    return _p3o(inputs, settings)


@register_loss("p3o_no_cap", **_WITH_KL)
def p3o_no_cap(inputs: LossInputs, settings: P3OLossSettings) -> LossOutput:
    """Ablation of P3O without the cap: ``ℓ_t = -sg(r_t)·logπθ_t·A_t + (1 - ESS)·K(πθ, π_a; π_b)_t``.

    Plain importance-weighted REINFORCE plus P3O's ESS-weighted KL: separates what the cap does from the KL."""
    return _p3o(inputs, settings, cap=False)


@register_loss("p3o_no_kl", settings=P3OScopeSettings, ess_scope=settings_ess_scope, needs_untruncated_sampling=True)
def p3o_no_kl(inputs: LossInputs, settings: P3OScopeSettings) -> LossOutput:
    """Ablation of P3O without the KL term: ``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t``.

    Only the ESS cap adapts to the batch; nothing pulls the policy toward the behavior policy."""
    return _p3o(inputs, PAPER_SETTINGS, behavior_kl=False)


# The paper's reference implementation (FeynRL `algs/P3O/p3o.py`): the k3 toward π_b with its exponent clamped to ±10,
# the cap only, one ESS per batch.
PAPER_SETTINGS = P3OLossSettings(
    kl_estimator="k3_clamped",
    kl_anchor="behavior",
    trust_region="none",
    ess_scope="batch",
    other_model_weight="ess_cap",
)


@register_loss("p3o_reference", needs_untruncated_sampling=True)
def p3o_reference(inputs: LossInputs, settings: NoSettings) -> LossOutput:
    """The paper's reference implementation, one setting away from the default (``loss="p3o_reference"``):
    ``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t + (1 - ESS)·k3_clamped(πθ, π_b)_t`` with one ESS over the whole batch
    (not ESS-scoped: it has no ``ess_scope``), no trust region. The same as ``loss="p3o"`` with
    ``loss_config={"kl_estimator": "k3_clamped", "kl_anchor": "behavior", "trust_region": "none", "ess_scope":
    "batch", "other_model_weight": "ess_cap"}``."""
    return _p3o(inputs, PAPER_SETTINGS)
