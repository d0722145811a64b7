"""The P3O objective and its GRPO/PPO-clip baseline, as small pure-torch functions.

Shapes: ``logprobs``, ``behavior_logprobs``, ``ref_logprobs``, ``entropy`` and ``mask`` are ``[B, T]`` (one entry
per *target* token; ``mask`` is 1 for completion tokens and 0 for prompt tokens and padding). ``advantages`` is
either ``[B]`` (one per sequence, broadcast to its tokens) or ``[B, T]``.

Distributed contract: when ``torch.distributed`` is initialized, every statistic that defines the objective (the
ESS sums and the valid-token count ``N``) is all-reduced over the default process group. Each rank then returns
its *share* of the global loss, ``Σ_{t on this rank} ℓ_t / N``: summing these shares (or their gradients) over the
ranks gives exactly the loss of one process holding the whole batch. DDP *averages* gradients, so a caller under
DDP multiplies the returned loss by the world size (the learner does). All ranks must call these functions the
same number of times (collectives inside).

This module imports only torch (and its sibling `rllib_p3o.core.kl_estimators`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from rllib_p3o.core.kl_estimators import KL_LOG_RATIO_CLIP as KL_LOG_RATIO_CLIP  # re-exported
from rllib_p3o.core.kl_estimators import get_kl_estimator, kl_k3

# A token whose log-ratio log(πθ/π_b) is below this counts as rejected by the learner (`rejected_fraction`).
REJECTED_LOG_RATIO = -10.0

# A ratio counts toward `cap_fraction` only if it exceeds ESS by more than this relative margin.
CAP_RTOL = 1e-4

Metrics = Dict[str, torch.Tensor]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(t: torch.Tensor, op=None, enabled: bool = True) -> torch.Tensor:
    """All-reduce ``t`` in place over the default group when distributed; a no-op otherwise."""
    if enabled and _distributed():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def _expand(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1:
        return advantages.unsqueeze(-1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages must be [B] or {list(like.shape)}, got {list(advantages.shape)}")
    return advantages


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where`, not `x * mask`: a NaN/inf in a padded slot must not leak into the sum.
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def _log_ratio_stats(log_ratios: torch.Tensor, mask: torch.Tensor, all_reduce: bool = True) -> Dict[str, torch.Tensor]:
    """Global (all-reduced) ratio statistics computed stably from log-ratios, in float64.

    ESS is scale-invariant, ``ESS(c·r) = ESS(r)``, so the ratios are rescaled by the global maximum before summing:
    ``w = exp(l - max l)``. No ratio can overflow; if some ratios are +inf, the limit is taken exactly (the inf tokens
    get weight 1, the rest 0, so ESS = #inf / n). NaN log-ratios are left out of the statistic.
    """
    with torch.no_grad():
        l = log_ratios.detach().to(torch.float64)
        valid = mask.bool() & ~torch.isnan(l)
        neg_inf = torch.tensor(float("-inf"), dtype=torch.float64, device=l.device)
        l_max = torch.where(valid, l, neg_inf).max() if l.numel() else neg_inf.clone()
        l_max = _all_reduce(l_max.reshape(1).clone(), dist.ReduceOp.MAX, all_reduce)[0]
        if torch.isposinf(l_max):
            w = (l == float("inf")).to(torch.float64)
        elif torch.isneginf(l_max):  # no valid token, or every ratio is 0: nothing to weigh
            w = torch.ones_like(l)
        else:
            w = torch.exp(l - l_max)
        sums = torch.stack([_masked_sum(w, valid), _masked_sum(w * w, valid), valid.sum().to(torch.float64)])
        s1, s2, n = _all_reduce(sums, enabled=all_reduce)
        if n > 0 and s2 > 0:
            ess = (s1 * s1 / (n * s2)).clamp(0.0, 1.0)
        else:
            ess = torch.ones((), dtype=torch.float64, device=l.device)
        return {"ess": ess, "n": n, "log_ratio_max": l_max}


def effective_sample_size_from_log_ratios(
    log_ratios: torch.Tensor, mask: torch.Tensor, all_reduce: bool = True
) -> torch.Tensor:
    """Normalized ESS of ``r = exp(log_ratios)`` over the valid tokens; see `effective_sample_size`.

    ``all_reduce=False`` gives the ESS of this process's tokens only (for diagnostics of a subset).
    """
    return _log_ratio_stats(log_ratios, mask, all_reduce)["ess"]


def effective_sample_size(ratios: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalized effective sample size of importance ratios over the valid tokens of the (global) batch.

    ``ESS = (Σ r)² / (n · Σ r²)`` over the ``n`` tokens where ``mask`` is 1, which lies in ``[1/n, 1]``: 1 when all
    ratios are equal (on-policy data), ``k/n`` when ``k`` tokens carry all the weight. Sums are taken in float64
    after rescaling by the largest ratio (ESS is scale-invariant), so large ratios cannot overflow. When
    ``torch.distributed`` is initialized, ``Σr``, ``Σr²`` and ``n`` are all-reduced before dividing, so every rank
    gets the ESS of the union of the shards. Returns a 0-dim float64 tensor without gradient; 1.0 when no token
    is valid. Never NaN (NaN ratios are left out).
    """
    return effective_sample_size_from_log_ratios(torch.log(ratios.detach().to(torch.float64)), mask)


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Group-normalized advantages: ``A_i = (R_i - mean_g) / (std_g + eps)`` over the rows of each group ``g``.

    ``std_g`` is the sample standard deviation (n-1). A group of one row, or whose rewards are all equal, gets 0:
    it carries no preference. A NaN reward (an *unscorable* completion: no reward function scored it) is left out of
    its group's mean and standard deviation and gets advantage 0, as in TRL. Compute this over whole groups *before*
    the batch is sharded across learners.
    """
    rewards = rewards.to(torch.float64)
    scored = ~torch.isnan(rewards)
    r = torch.where(scored, rewards, torch.zeros_like(rewards))
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    counts = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, scored.to(torch.float64))
    sums = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, r)
    means = sums / counts.clamp(min=1)
    centered = torch.where(scored, r - means[inverse], torch.zeros_like(r))
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, centered * centered)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    adv = centered / (std[inverse] + eps)
    return torch.where(scored & (counts[inverse] > 1), adv, torch.zeros_like(adv)).to(torch.float32)


def groups_without_signal(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Share of prompt groups whose rewards are all equal: ``|{g : max_g R = min_g R}| / |groups|``.

    Such a group gets zero advantage everywhere, so it adds nothing to the policy gradient. Near 1 the task is too
    hard (or too easy) for the current policy and learning stalls, whatever the objective. NaN rewards (unscorable
    completions) are left out; a group without any scored completion counts as one without signal.
    """
    scored = ~torch.isnan(rewards)
    if not bool(scored.all()):
        kept = torch.unique(group_ids).numel()
        inside = groups_without_signal(rewards[scored], group_ids[scored]) * torch.unique(group_ids[scored]).numel()
        return float((inside + kept - torch.unique(group_ids[scored]).numel()) / kept)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    if n_groups == 0:
        return 0.0
    rewards = rewards.to(torch.float64)
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, rewards, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, rewards, "amin")
    return float((hi == lo).to(torch.float64).mean())


def _token_mean(x: torch.Tensor, mask: torch.Tensor, n_global: torch.Tensor) -> torch.Tensor:
    """This rank's share of the global token-mean: ``Σ_{valid, local} x / N_global``."""
    return _masked_sum(x, mask) / n_global.to(x.dtype)


def global_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """This rank's share of the token-mean of ``x`` over the global batch: ``Σ_{t valid here} x_t / N``, with ``N``
    the valid-token count all-reduced over the learners (so the shares sum to the mean of the whole batch)."""
    n_global = _all_reduce(mask.bool().sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
    return _token_mean(x, mask.bool(), n_global)


def mismatch_metrics(logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """The training-inference mismatch on tokens the engine sampled with the learner's current weights.

    With ``l_t = logπ_learner(y_t) - logπ_engine(y_t)`` over the ``n`` valid tokens of the global batch::

        mismatch_kl            = (1/n) Σ_t (exp(l_t) - 1 - l_t)     k3 estimate of KL(π_engine || π_learner)
        mismatch_prob_abs_diff = (1/n) Σ_t |exp(logπ_learner) - exp(logπ_engine)|
        mismatch_ess           = ESS of r_t = exp(l_t)               (`effective_sample_size`)

    All three are 0, 0 and 1 when learner and engine agree exactly. No gradient; all-reduced like the objectives.
    """
    with torch.no_grad():
        mask = mask.bool()
        learner = logprobs.detach().to(torch.float64)
        engine = torch.where(mask, engine_logprobs.to(torch.float64), learner)
        log_ratio = learner - engine
        stats = _log_ratio_stats(log_ratio, mask)
        k3 = torch.expm1(log_ratio) - log_ratio
        sums = _all_reduce(
            torch.stack([_masked_sum(k3, mask), _masked_sum((learner.exp() - engine.exp()).abs(), mask)])
        )
        n = stats["n"].clamp(min=1.0)
        return {
            "mismatch_kl": (sums[0] / n).to(torch.float32),
            "mismatch_prob_abs_diff": (sums[1] / n).to(torch.float32),
            "mismatch_ess": stats["ess"].to(torch.float32),
            "mismatch_num_tokens": stats["n"].to(torch.float32),
        }


def _diagnostics(
    log_ratios: torch.Tensor,
    mask: torch.Tensor,
    kl_tok: torch.Tensor,
    n_global: torch.Tensor,
    cap: Optional[torch.Tensor],
    extra: Dict[str, torch.Tensor],
) -> Metrics:
    """Global token-means of the diagnostics, with one SUM all-reduce."""
    with torch.no_grad():
        r = torch.exp(log_ratios.detach().to(torch.float64))
        names = ["ratio_mean", "kl_behavior"] + list(extra)
        vals = [r, kl_tok.detach().to(torch.float64)] + [v.detach().to(torch.float64) for v in extra.values()]
        if cap is not None:
            names.append("cap_fraction")
            # Relative tolerance: float noise (r = 1 + 5e-7 against ESS = 1) is not a cap.
            vals.append((r > cap * (1.0 + CAP_RTOL)).to(torch.float64))
        sums = _all_reduce(torch.stack([_masked_sum(v, mask) for v in vals]))
        return {k: (s / n_global).to(torch.float32) for k, s in zip(names, sums)}


def _prepare(logprobs, behavior_logprobs, advantages, mask):
    mask = mask.bool()
    # Padded behavior entries may hold anything (0, NaN): make their log-ratio exactly 0 so no NaN can reach the
    # gradient through an unselected `where` branch.
    behavior = torch.where(mask, behavior_logprobs.to(logprobs.dtype), logprobs.detach())
    adv = _expand(advantages.to(logprobs.dtype), logprobs)
    return mask, behavior, adv


def _regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff):
    """``β_ref · KL(π‖π_ref) - β_ent · H`` as token-means, plus their metrics."""
    loss = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    extra: Dict[str, torch.Tensor] = {}
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.to(logprobs.dtype), logprobs.detach())
        kl_ref = kl_k3(logprobs, ref)
        extra["kl_ref"] = kl_ref
        if kl_ref_coeff:
            loss = loss + kl_ref_coeff * _token_mean(kl_ref, mask, n_global)
    if entropy is not None:
        extra["entropy"] = entropy
        if entropy_coeff:
            loss = loss - entropy_coeff * _token_mean(entropy, mask, n_global)
    return loss, extra


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
    kl_estimator: str = "k3",
    anchor_logprobs: Optional[torch.Tensor] = None,
    trust_region: str = "none",
    lagging: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """The batch-adaptive P3O loss (``cap=False`` / ``behavior_kl=False``: its ablations, `rllib_p3o.core.losses`).

    With ``r_t = exp(logπθ_t - logπ_b_t)`` and ``ESS`` the normalized effective sample size of all valid ``r_t`` of
    the global batch (`effective_sample_size`), per valid token::

        ℓ_t = -sg(clamp(r_t, 0, ESS)) · logπθ_t · A_t  +  (1 - ESS) · K(πθ, π_a; π_b)_t
              + β_ref · k3(logπθ_t - logπ_ref_t)  -  β_ent · H_t

    and ``L = (1/N) Σ_t ℓ_t`` with ``N`` the global number of valid tokens (``sg`` stop-gradient). ``K`` is the
    per-token KL estimator ``kl_estimator`` (`rllib_p3o.core.kl_estimators`: ``"k3"``, ``"k3_clamped"``,
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
    tokens sampled by weights the policy has moved from since, `rllib_p3o.core.trust_region`)::

        "ess_clip":  m_t = 0 where (A_t > 0 ∧ r_t > 1 + ε_t) ∨ (A_t < 0 ∧ r_t < 1 - ε_t),  ε_t = sqrt(1/ESS_t - 1)
        "ess_band":  the same with the band [ESS_t, 1/ESS_t]
        ℓ_t = -m_t · sg(min(r_t, ESS_t)) · logπθ_t · A_t  +  (1 - ESS_t) · K_t

    A lagging token outside the band on the side its advantage pushes toward gets no policy gradient (PPO's clip,
    applied to P3O's detached weight); ``ε_t`` is the coefficient of variation of the ratios of the token's ESS
    group, so the band is the spread the data show, with no coefficient. Fresh tokens (sampled by the current
    weights: their ratios carry only the sampler's mismatch) and other models' tokens are never masked. The KL term
    acts on every token. ``"none"`` (the default): ``m_t = 1``.

    Returns ``(loss, metrics)`` where loss is this rank's share (see module docstring) and metrics are global
    token-means: ``loss``, ``pg_loss``, ``ess`` (of the whole batch), ``ratio_mean``, ``ratio_max``,
    ``cap_fraction`` (tokens with ``r`` above their cap), ``kl_behavior`` (the KL term's estimator, unweighted),
    ``kl_weight`` (token-mean of ``1 - ESS``), ``kl_grad_share`` and ``rejected_fraction`` (`_gradient_shares`),
    ``num_tokens`` and, when given, ``kl_ref``/``entropy``; with a trust region also ``trust_masked_fraction`` (tokens
    whose policy gradient it removed), ``lagging_fraction`` and ``trust_eps_max`` (the widest band's ε).
    """
    if trust_region not in TRUST_REGIONS:
        raise ValueError(f"trust_region must be one of {', '.join(TRUST_REGIONS)}, got {trust_region!r}")
    mask, behavior, adv = _prepare(logprobs, behavior_logprobs, advantages, mask)
    anchor = behavior if anchor_logprobs is None else torch.where(mask, anchor_logprobs.to(logprobs.dtype), behavior)
    log_ratios = logprobs - behavior
    stats = _log_ratio_stats(log_ratios, mask)
    ess = stats["ess"]
    n_global = stats["n"].clamp(min=1.0)
    if ess_groups is None:
        ess_tok = ess.to(logprobs.dtype).expand_as(logprobs)
    else:
        ess_tok = _grouped_ess(log_ratios, mask, ess_groups, num_ess_groups).to(logprobs.dtype)

    ratio = torch.exp(log_ratios.detach())
    weight = torch.minimum(ratio, ess_tok) if cap else ratio
    trust = _trust_region_terms(trust_region, ratio, adv, ess_tok, lagging, mask)
    if trust:
        weight = torch.where(trust["masked"], torch.zeros_like(weight), weight)
    pg_tok = -weight * logprobs * adv
    estimator = get_kl_estimator(kl_estimator)
    kl_tok = estimator(logprobs, anchor, behavior)
    kl_weight = (1.0 - ess_tok) if behavior_kl else torch.zeros_like(ess_tok)
    pg_loss = _token_mean(pg_tok, mask, n_global)
    kl_loss = _token_mean(kl_weight * kl_tok, mask, n_global) if behavior_kl else 0.0
    reg_loss, extra = _regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + kl_loss + reg_loss

    extra = dict(extra, kl_weight=kl_weight)
    metrics = _diagnostics(log_ratios, mask, kl_tok, n_global, cap=ess_tok, extra=extra)
    metrics.update(_gradient_shares(logprobs, -weight * adv, kl_weight, estimator, anchor, behavior, mask))
    metrics.update(_loss_metrics(loss, pg_loss, n_global, stats))
    if trust:
        metrics.update(trust["metrics"])
    return loss, metrics


# P3O's trust regions on lagging tokens (`p3o_loss`, `rllib_p3o.core.trust_region`).
TRUST_REGIONS = ("none", "ess_clip", "ess_band")


def _trust_region_terms(
    trust_region: str,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    ess_tok: torch.Tensor,
    lagging: Optional[torch.Tensor],
    mask: torch.Tensor,
) -> Dict[str, Any]:
    """The tokens a trust region masks (``"masked"``) and its metrics; ``{}`` for ``"none"``."""
    # Imported here: `rllib_p3o.core.trust_region` builds on this module's all-reduce helpers.
    from rllib_p3o.core import trust_region as tr

    if trust_region == "none":
        return {}
    ess = ess_tok.detach().to(torch.float64)
    if trust_region == "ess_clip":
        low, high = tr.ess_band(ess)
    else:  # "ess_band": the cap's own band
        low, high = ess, 1.0 / ess.clamp(min=torch.finfo(torch.float64).tiny)
    applies = torch.zeros_like(mask) if lagging is None else lagging.bool().to(mask.device)
    if applies.dim() == 1:
        applies = applies.unsqueeze(-1)
    applies = applies.expand_as(mask) & mask
    masked = tr.outward_mask(ratio.to(torch.float64), adv, low, high, applies)
    with torch.no_grad():
        eps = torch.where(applies, high - 1.0, torch.zeros_like(high))
        eps_max = eps.max().reshape(1).clone() if eps.numel() else torch.zeros(1, dtype=eps.dtype, device=eps.device)
        eps_max = _all_reduce(eps_max, dist.ReduceOp.MAX)[0]
    return {
        "masked": masked,
        "metrics": {
            "trust_masked_fraction": tr.masked_share(masked, mask),
            "lagging_fraction": tr.masked_share(applies, mask),
            "trust_eps_max": eps_max.to(torch.float32),
        },
    }


def _gradient_shares(
    logprobs: torch.Tensor,
    pg_coeff: torch.Tensor,
    kl_weight: torch.Tensor,
    estimator,
    anchor: torch.Tensor,
    behavior: torch.Tensor,
    mask: torch.Tensor,
) -> Metrics:
    """Where the gradient comes from, per token, before the model's Jacobian (no gradient; all-reduced)::

        g_pg_t = ∂ℓ_pg/∂logπθ_t = -w_t·A_t        g_kl_t = (1 - ESS_t) · ∂K_t/∂logπθ_t
        kl_grad_share     = ‖g_kl‖₂ / (‖g_pg‖₂ + ‖g_kl‖₂)                    over the valid tokens of the batch
        rejected_fraction = |{t : log(πθ_t/π_b_t) < REJECTED_LOG_RATIO}| / N

    ``kl_grad_share`` near 1: the trust-region term, not the reward, drives the update. ``rejected_fraction``:
    tokens the learner has all but ruled out, where the KL estimators differ most (`rllib_p3o.core.kl_estimators`).
    """
    with torch.enable_grad():
        lp = logprobs.detach().clone().requires_grad_(True)
        (dk,) = torch.autograd.grad(estimator(lp, anchor.detach(), behavior.detach()).sum(), lp)
    with torch.no_grad():
        g_pg = pg_coeff.detach().to(torch.float64)
        g_kl = (kl_weight.detach() * dk).to(torch.float64)
        rejected = ((logprobs.detach() - behavior) < REJECTED_LOG_RATIO).to(torch.float64)
        sums = _all_reduce(
            torch.stack([_masked_sum(g_pg * g_pg, mask), _masked_sum(g_kl * g_kl, mask), _masked_sum(rejected, mask)])
        )
        n = _all_reduce(mask.sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
        pg_norm, kl_norm = sums[0].sqrt(), sums[1].sqrt()
        total = pg_norm + kl_norm
        share = kl_norm / total if total > 0 else torch.zeros((), dtype=torch.float64, device=total.device)
        return {"kl_grad_share": share.to(torch.float32), "rejected_fraction": (sums[2] / n).to(torch.float32)}


def _grouped_ess(log_ratios: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[B, T]`` tensor holding, at each token, the global ESS of its group (``groups``: ``[B]`` per row or
    ``[B, T]`` per token; `_log_ratio_stats` per group; every rank runs the same ``num_groups`` collectives,
    whichever groups it holds)."""
    groups = groups.to(log_ratios.device).long()
    if groups.dim() == 1:
        groups = groups.unsqueeze(-1)
    groups = groups.expand_as(log_ratios)
    per_group = torch.ones(max(int(num_groups), 1), dtype=torch.float64, device=log_ratios.device)
    for g in range(int(num_groups)):
        per_group[g] = _log_ratio_stats(log_ratios, mask & (groups == g))["ess"]
    return per_group[groups.clamp(0, per_group.numel() - 1)]


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

    ``L = (1/N) Σ_t ℓ_t`` over the ``N`` valid tokens of the global batch, as in `p3o_loss`. Metrics as in
    `p3o_loss` (``ess`` and ``kl_behavior`` are diagnostics here, not part of the loss) plus ``clip_fraction``,
    the share of tokens whose surrogate was clipped (no gradient).
    """
    mask, behavior, adv = _prepare(logprobs, behavior_logprobs, advantages, mask)
    log_ratios = logprobs - behavior
    stats = _log_ratio_stats(log_ratios, mask)
    n_global = stats["n"].clamp(min=1.0)

    ratio = torch.exp(log_ratios)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg_tok = -torch.minimum(unclipped, clipped)
    pg_loss = _token_mean(pg_tok, mask, n_global)
    reg_loss, extra = _regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff)
    loss = pg_loss + reg_loss

    extra = dict(extra, clip_fraction=(clipped < unclipped).to(torch.float64))
    metrics = _diagnostics(log_ratios, mask, kl_k3(logprobs.detach(), behavior), n_global, cap=None, extra=extra)
    metrics.update(_loss_metrics(loss, pg_loss, n_global, stats))
    return loss, metrics


def _loss_metrics(loss, pg_loss, n_global, stats) -> Metrics:
    with torch.no_grad():
        # The returned loss is this rank's share; the metric is the global loss.
        shares = _all_reduce(torch.stack([loss.detach(), pg_loss.detach()]).to(torch.float64))
        return {
            "loss": shares[0].to(torch.float32),
            "pg_loss": shares[1].to(torch.float32),
            "ess": stats["ess"].to(torch.float32),
            "ratio_max": torch.exp(stats["log_ratio_max"]).to(torch.float32),
            "num_tokens": n_global.to(torch.float32),
        }
