"""The pieces the losses share: the padded inputs made safe, token means over the global batch, ESS per group, the
optional reference-KL and entropy terms, and the diagnostics every loss reports. Pure torch.

Distributed contract (every loss of this package): every statistic that defines an objective (the ESS sums, the
valid-token count ``N``) is all-reduced over the default process group (`rllib_p3o.core.batch_stats`). Each rank then
returns its *share* of the global loss, ``Σ_{t on this rank} ℓ_t / N``: summing these shares (or their gradients)
over the ranks gives exactly the loss of one process holding the whole batch. DDP *averages* gradients, so a caller
under DDP multiplies the returned loss by the world size (the learner does).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rllib_p3o.core.batch_stats import Metrics, log_ratio_stats, masked_sum, reduce_across_learners, token_mean
from rllib_p3o.core.losses.kl_estimators import kl_k3

# A token whose log-ratio log(πθ/π_b) is below this counts as rejected by the learner (`rejected_fraction`).
REJECTED_LOG_RATIO = -10.0

# A ratio counts toward `cap_fraction` only if it exceeds ESS by more than this relative margin.
CAP_RTOL = 1e-4


def expand_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1:
        return advantages.unsqueeze(-1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages must be [B] or {list(like.shape)}, got {list(advantages.shape)}")
    return advantages


def prepare(logprobs, behavior_logprobs, advantages, mask):
    mask = mask.bool()
    # Padded behavior entries may hold anything (0, NaN): make their log-ratio exactly 0 so no NaN can reach the
    # gradient through an unselected `where` branch.
    behavior = torch.where(mask, behavior_logprobs.to(logprobs.dtype), logprobs.detach())
    adv = expand_advantages(advantages.to(logprobs.dtype), logprobs)
    return mask, behavior, adv


def regularizers(logprobs, mask, n_global, ref_logprobs, kl_ref_coeff, entropy, entropy_coeff):
    """``β_ref · KL(π‖π_ref) - β_ent · H`` as token-means, plus their metrics."""
    loss = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    extra: Dict[str, torch.Tensor] = {}
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.to(logprobs.dtype), logprobs.detach())
        kl_ref = kl_k3(logprobs, ref)
        extra["kl_ref"] = kl_ref
        if kl_ref_coeff:
            loss = loss + kl_ref_coeff * token_mean(kl_ref, mask, n_global)
    if entropy is not None:
        extra["entropy"] = entropy
        if entropy_coeff:
            loss = loss - entropy_coeff * token_mean(entropy, mask, n_global)
    return loss, extra


def diagnostics(
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
        sums = reduce_across_learners(torch.stack([masked_sum(v, mask) for v in vals]))
        return {k: (s / n_global).to(torch.float32) for k, s in zip(names, sums)}


def gradient_shares(
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
    tokens the learner has all but ruled out, where the KL estimators differ most (`rllib_p3o.core.losses.kl_estimators`).
    """
    with torch.enable_grad():
        lp = logprobs.detach().clone().requires_grad_(True)
        (dk,) = torch.autograd.grad(estimator(lp, anchor.detach(), behavior.detach()).sum(), lp)
    with torch.no_grad():
        g_pg = pg_coeff.detach().to(torch.float64)
        g_kl = (kl_weight.detach() * dk).to(torch.float64)
        rejected = ((logprobs.detach() - behavior) < REJECTED_LOG_RATIO).to(torch.float64)
        sums = reduce_across_learners(
            torch.stack([masked_sum(g_pg * g_pg, mask), masked_sum(g_kl * g_kl, mask), masked_sum(rejected, mask)])
        )
        n = reduce_across_learners(mask.sum().to(torch.float64).reshape(1).clone())[0].clamp(min=1.0)
        pg_norm, kl_norm = sums[0].sqrt(), sums[1].sqrt()
        total = pg_norm + kl_norm
        share = kl_norm / total if total > 0 else torch.zeros((), dtype=torch.float64, device=total.device)
        return {"kl_grad_share": share.to(torch.float32), "rejected_fraction": (sums[2] / n).to(torch.float32)}


def grouped_ess(log_ratios: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[B, T]`` tensor holding, at each token, the global ESS of its group (``groups``: ``[B]`` per row or
    ``[B, T]`` per token; `log_ratio_stats` per group; every rank runs the same ``num_groups`` collectives,
    whichever groups it holds)."""
    groups = groups.to(log_ratios.device).long()
    if groups.dim() == 1:
        groups = groups.unsqueeze(-1)
    groups = groups.expand_as(log_ratios)
    per_group = torch.ones(max(int(num_groups), 1), dtype=torch.float64, device=log_ratios.device)
    for g in range(int(num_groups)):
        per_group[g] = log_ratio_stats(log_ratios, mask & (groups == g))["ess"]
    return per_group[groups.clamp(0, per_group.numel() - 1)]


def loss_metrics(loss, pg_loss, n_global, stats) -> Metrics:
    with torch.no_grad():
        # The returned loss is this rank's share; the metric is the global loss.
        shares = reduce_across_learners(torch.stack([loss.detach(), pg_loss.detach()]).to(torch.float64))
        return {
            "loss": shares[0].to(torch.float32),
            "pg_loss": shares[1].to(torch.float32),
            "ess": stats["ess"].to(torch.float32),
            "ratio_max": torch.exp(stats["log_ratio_max"]).to(torch.float32),
            "num_tokens": n_global.to(torch.float32),
        }
