"""Trust regions that act on tokens the policy has moved away from since they were sampled, as pure-torch functions.

P3O's cap ``min(r, ESS)`` truncates an importance weight but never zeroes a token's gradient, and its KL weight
``1 - ESS`` is second order in the drift of the ratios (for ratios spread by ``σ``, ``1 - ESS ≈ σ²``): on data several
policy versions old, a token the policy has already pushed far above its behavior probability keeps being pushed.
The functions here bound that, from the batch's own statistics:

- `ess_band`: the band ``[1 - ε, 1 + ε]`` of ratios a token may leave only toward 1, with ``ε = sqrt(1/ESS - 1)``,
  the coefficient of variation of the ratios whose ESS is given (exact: for ratios with mean ``m``,
  ``ESS = m² / E[r²] = 1 / (1 + CV²)``). No coefficient: the band is the spread the batch itself shows.
- `outward_mask`: PPO's clip as a mask on a weighted (not ratio-carrying) policy-gradient term: the tokens whose
  ratio is outside the band *in the direction their advantage pushes* get no policy gradient (PPO's clipped
  surrogate has zero gradient exactly there).
- `second_moment_mask`: M2PO's mask (Zheng et al. 2025, arXiv 2510.01161): the tokens with the largest squared
  log-ratio are left out until the mean of the rest is below a threshold.

Pure torch. `trust_region_terms` is what P3O's ``trust_region`` setting applies (`rllib_p3o.core.losses.p3o`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from rllib_p3o.core.batch_stats import distributed, reduce_across_learners


def ess_band(ess: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(1 - ε, 1 + ε)`` with ``ε = sqrt(1/ESS - 1)``: the band of one coefficient of variation around 1.

    For importance ratios ``r`` with mean ``m`` and variance ``v`` (over the tokens whose ESS is ``ESS``),
    ``ESS = (Σr)² / (n·Σr²) = m² / (m² + v)``, so ``sqrt(1/ESS - 1) = sqrt(v)/m``: ε is the ratios' own relative
    spread. ESS = 1 (fresh data) gives ε = 0; ESS = 0.959 gives ε = 0.207 (the scale of GRPO's 0.2); ESS = 0.8
    gives 0.5. Elementwise on a tensor of ESS values in (0, 1]; no gradient.
    """
    with torch.no_grad():
        ess = ess.clamp(min=torch.finfo(torch.float64).tiny, max=1.0)
        eps = torch.sqrt((1.0 / ess - 1.0).clamp(min=0.0))
        return 1.0 - eps, 1.0 + eps


def outward_mask(
    ratio: torch.Tensor, advantages: torch.Tensor, low: torch.Tensor, high: torch.Tensor, applies: torch.Tensor
) -> torch.Tensor:
    """Tokens whose policy gradient a trust region removes: ``applies ∧ ((A > 0 ∧ r > high) ∨ (A < 0 ∧ r < low))``.

    A token outside ``[low, high]`` on the side its advantage pushes toward would only move further out; PPO's
    clipped surrogate ``min(r·A, clip(r, low, high)·A)`` has zero gradient on exactly these tokens, and this mask
    applies the same rule to a loss whose weight is detached (P3O's ``-sg(w)·logπθ·A``). Tokens inside the band, or
    outside it on the side their advantage pulls back from, keep their gradient. All arguments broadcast to
    ``[B, T]``; returns a bool tensor, no gradient.
    """
    with torch.no_grad():
        outward = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
        return outward & applies.bool()


def second_moment_mask(log_ratios: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's mask: the valid tokens to *keep* so that the mean of ``M2_t = (log r_t)²`` over them is below
    ``threshold``, leaving out the fewest tokens, largest ``M2`` first.

    With ``M2`` sorted in descending order ``m_1 ≥ m_2 ≥ … ≥ m_n`` over the ``n`` valid tokens of the global batch,
    keep ``{t : M2_t ≤ m_k}`` for the smallest ``k`` with ``mean(m_k, …, m_n) < threshold`` (all tokens when the
    mean of all is below it already, none when even the smallest ``M2`` is not). Across learners the valid ``M2`` values are gathered, so every learner applies
    the same cut. Ties at the cut are kept together. Returns a bool ``[B, T]`` tensor, no gradient.
    """
    with torch.no_grad():
        mask = mask.bool()
        m2 = torch.where(
            mask, log_ratios.detach().to(torch.float64) ** 2, torch.zeros((), dtype=torch.float64, device=mask.device)
        )
        values = _gather_valid(m2[mask])
        if values.numel() == 0:
            return mask
        ordered = torch.sort(values, descending=True).values
        n = ordered.numel()
        suffix_mean = ordered.flip(0).cumsum(0).flip(0) / torch.arange(
            n, 0, -1, dtype=torch.float64, device=ordered.device
        )
        below = torch.nonzero(suffix_mean < threshold)
        if below.numel() == 0:  # not even the smallest M2 is below the threshold: nothing is kept
            return torch.zeros_like(mask)
        return mask & (m2 <= ordered[int(below[0])])


def _gather_valid(values: torch.Tensor) -> torch.Tensor:
    """The 1-d ``values`` of every learner, concatenated (this learner's alone when not distributed)."""
    if not distributed():
        return values
    size = torch.tensor([values.numel()], dtype=torch.long, device=values.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = int(max(int(s) for s in sizes))
    padded = torch.zeros(longest, dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return torch.cat([g[: int(s)] for g, s in zip(gathered, sizes)])


def masked_share(selected: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``|selected ∧ mask| / |mask|`` over the global batch (all-reduced), in float32; 0 without valid tokens."""
    with torch.no_grad():
        sums = torch.stack([(selected.bool() & mask.bool()).sum(), mask.bool().sum()]).to(torch.float64)
        sums = reduce_across_learners(sums)
        return (sums[0] / sums[1].clamp(min=1.0)).to(torch.float32)


# P3O's trust regions on lagging tokens (`rllib_p3o.core.losses.p3o.p3o_loss`): "none" is the paper's.
TRUST_REGIONS = ("none", "ess_clip", "ess_band")


def trust_region_terms(
    trust_region: str,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    ess_tok: torch.Tensor,
    lagging: Optional[torch.Tensor],
    mask: torch.Tensor,
) -> Dict[str, Any]:
    """The tokens a trust region masks (``"masked"``) and its metrics; ``{}`` for ``"none"``."""
    if trust_region == "none":
        return {}
    ess = ess_tok.detach().to(torch.float64)
    if trust_region == "ess_clip":
        low, high = ess_band(ess)
    else:  # "ess_band": the cap's own band
        low, high = ess, 1.0 / ess.clamp(min=torch.finfo(torch.float64).tiny)
    applies = torch.zeros_like(mask) if lagging is None else lagging.bool().to(mask.device)
    if applies.dim() == 1:
        applies = applies.unsqueeze(-1)
    applies = applies.expand_as(mask) & mask
    masked = outward_mask(ratio.to(torch.float64), adv, low, high, applies)
    with torch.no_grad():
        eps = torch.where(applies, high - 1.0, torch.zeros_like(high))
        eps_max = eps.max().reshape(1).clone() if eps.numel() else torch.zeros(1, dtype=eps.dtype, device=eps.device)
        eps_max = reduce_across_learners(eps_max, dist.ReduceOp.MAX)[0]
    return {
        "masked": masked,
        "metrics": {
            "trust_masked_fraction": masked_share(masked, mask),
            "lagging_fraction": masked_share(applies, mask),
            "trust_eps_max": eps_max.to(torch.float32),
        },
    }
