"""Statistics of a token batch that every process computes alike: the normalized effective sample size (ESS) of
importance ratios, group-normalized advantages, token means over the global batch, and the training-inference
mismatch. Pure torch.

Shapes: token tensors are ``[B, T]`` (one entry per *target* token; ``mask`` is 1 for completion tokens and 0 for
prompt tokens and padding).

Distributed contract: when ``torch.distributed`` is initialized, every statistic (the ESS sums, the valid-token count
``N``, the token means) is all-reduced over the default process group, so every learner gets the statistic of the
union of the shards. All ranks must call these functions the same number of times (collectives inside).
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.distributed as dist

Metrics = Dict[str, torch.Tensor]


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def reduce_across_learners(t: torch.Tensor, op=None, enabled: bool = True) -> torch.Tensor:
    """All-reduce ``t`` in place over the default group when distributed; a no-op otherwise."""
    if enabled and distributed():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where`, not `x * mask`: a NaN/inf in a padded slot must not leak into the sum.
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def log_ratio_stats(log_ratios: torch.Tensor, mask: torch.Tensor, all_reduce: bool = True) -> Dict[str, torch.Tensor]:
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
        l_max = reduce_across_learners(l_max.reshape(1).clone(), dist.ReduceOp.MAX, all_reduce)[0]
        if torch.isposinf(l_max):
            w = (l == float("inf")).to(torch.float64)
        elif torch.isneginf(l_max):  # no valid token, or every ratio is 0: nothing to weigh
            w = torch.ones_like(l)
        else:
            w = torch.exp(l - l_max)
        sums = torch.stack([masked_sum(w, valid), masked_sum(w * w, valid), valid.sum().to(torch.float64)])
        s1, s2, n = reduce_across_learners(sums, enabled=all_reduce)
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
    return log_ratio_stats(log_ratios, mask, all_reduce)["ess"]


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
    counts = torch.zeros(n_groups, dtype=torch.float64, device=rewards.device).index_add_(
        0, inverse, scored.to(torch.float64)
    )
    sums = torch.zeros(n_groups, dtype=torch.float64, device=rewards.device).index_add_(0, inverse, r)
    means = sums / counts.clamp(min=1)
    centered = torch.where(scored, r - means[inverse], torch.zeros_like(r))
    sq = torch.zeros(n_groups, dtype=torch.float64, device=rewards.device).index_add_(0, inverse, centered * centered)
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
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64, device=rewards.device).scatter_reduce(
        0, inverse, rewards, "amax"
    )
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64, device=rewards.device).scatter_reduce(
        0, inverse, rewards, "amin"
    )
    return float((hi == lo).to(torch.float64).mean())


def token_mean(x: torch.Tensor, mask: torch.Tensor, n_global: torch.Tensor) -> torch.Tensor:
    """This rank's share of the global token-mean: ``Σ_{valid, local} x / N_global``."""
    return masked_sum(x, mask) / n_global.to(x.dtype)


def global_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """This rank's share of the token-mean of ``x`` over the global batch: ``Σ_{t valid here} x_t / N``, with ``N``
    the valid-token count all-reduced over the learners (so the shares sum to the mean of the whole batch)."""
    n_global = reduce_across_learners(mask.bool().sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
    return token_mean(x, mask.bool(), n_global)


def mismatch_metrics(logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """The training-inference mismatch on tokens the engine sampled with the learner's current weights.

    With ``l_t = logπ_learner(y_t) - logπ_engine(y_t)`` over the ``n`` valid tokens of the global batch::

        mismatch_kl            = (1/n) Σ_t (exp(l_t) - 1 - l_t)     k3 estimate of KL(π_engine || π_learner)
        mismatch_prob_abs_diff = (1/n) Σ_t |exp(logπ_learner) - exp(logπ_engine)|
        mismatch_ess           = ESS of r_t = exp(l_t)               (`effective_sample_size`)

    All three are 0, 0 and 1 when learner and engine agree exactly. No gradient; all-reduced like the losses' statistics.
    """
    with torch.no_grad():
        mask = mask.bool()
        learner = logprobs.detach().to(torch.float64)
        engine = torch.where(mask, engine_logprobs.to(torch.float64), learner)
        log_ratio = learner - engine
        stats = log_ratio_stats(log_ratio, mask)
        k3 = torch.expm1(log_ratio) - log_ratio
        sums = reduce_across_learners(
            torch.stack([masked_sum(k3, mask), masked_sum((learner.exp() - engine.exp()).abs(), mask)])
        )
        n = stats["n"].clamp(min=1.0)
        return {
            "mismatch_kl": (sums[0] / n).to(torch.float32),
            "mismatch_prob_abs_diff": (sums[1] / n).to(torch.float32),
            "mismatch_ess": stats["ess"].to(torch.float32),
            "mismatch_num_tokens": stats["n"].to(torch.float32),
        }
