"""Rows of a right-padded batch grouped by length, so the learner computes (almost) no padding.

A training batch is padded to its longest row. When completions end at very different lengths, a large share of
the token positions the model would run on are padding: compute spent on nothing. The learner instead sorts the rows
by length and runs the model once per *bucket* of similar lengths, each trimmed to its own longest row; the results
are put back in the batch's row order and width, so the loss, the ESS and the gradients are those of the padded
computation (each row's log-probs do not depend on the other rows of its forward pass), and the ESS is still taken
over the whole optimizer step.

Which buckets: the split of the sorted lengths into contiguous groups that minimizes the estimated cost

    cost = Σ_buckets (rows_b · width_b + call_cost)

where ``rows_b · width_b`` are the token positions bucket b computes and ``call_cost`` is the fixed cost of one
more forward/backward call, in token positions. It is solved exactly by dynamic programming over the distinct
lengths (O(U²) for U distinct lengths, vectorized).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Union

import numpy as np

# One more forward/backward call costs about as much as this many token positions (the model's Python and kernel
# launches). `benchmarks/bucket_call_cost.py` measured 47 positions for a 0.33M-parameter model on CPU, and for
# 2.44M and 10M a per-call cost within the fit's noise of zero: 64 errs toward fewer calls.
DEFAULT_CALL_COST_TOKENS = 64


def bucket_call_cost(setting: Union[bool, float]) -> float:
    """The call cost the model config's ``length_buckets`` asks for: ``True`` the default
    (`DEFAULT_CALL_COST_TOKENS`), ``False`` none of it (an infinite call cost: every batch runs padded to its longest
    row), a number that call cost in token positions (0: a bucket per distinct length)."""
    if isinstance(setting, bool):
        return DEFAULT_CALL_COST_TOKENS if setting else float("inf")
    if isinstance(setting, (int, float)) and setting >= 0:
        return float(setting)
    raise ValueError(
        f"length_buckets must be True, False or a call cost in token positions (a number >= 0), got {setting!r}"
    )


@dataclass(frozen=True)
class Bucket:
    """Rows ``rows`` (indices into the batch) computed together at token width ``width``."""

    rows: np.ndarray
    width: int


def plan_buckets(lengths: Sequence[int], call_cost: float = DEFAULT_CALL_COST_TOKENS) -> List[Bucket]:
    """Group rows of the given real lengths into buckets minimizing ``Σ (rows · width + call_cost)``.

    Rows of equal length always share a bucket; buckets come out in increasing width. Lengths of 0 are treated as 1
    (a filler row still needs one position)."""
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if lengths.size == 0:
        return []
    widths, counts = np.unique(lengths, return_counts=True)  # sorted distinct lengths
    rows_through = np.concatenate([[0], np.cumsum(counts)])  # rows with length <= widths[i-1]
    num = len(widths)
    best = np.zeros(num + 1)  # best[i]: least cost of the first i distinct lengths
    start = np.zeros(num + 1, dtype=np.int64)  # the last bucket of that split begins at distinct length start[i]
    for i in range(1, num + 1):
        # Last bucket = distinct lengths j..i-1 (0-based), width widths[i-1], rows rows_through[i] - rows_through[j].
        j = np.arange(i)
        cost = best[j] + (rows_through[i] - rows_through[j]) * widths[i - 1] + call_cost
        k = int(np.argmin(cost))
        best[i], start[i] = cost[k], k
    bounds = []
    i = num
    while i > 0:
        bounds.append((int(start[i]), i))
        i = int(start[i])
    order = np.argsort(lengths, kind="stable")
    return [
        Bucket(rows=order[rows_through[j] : rows_through[i]], width=int(widths[i - 1])) for j, i in reversed(bounds)
    ]


def padding_share(lengths: Sequence[int], buckets: Sequence[Bucket]) -> float:
    """Share of the computed token positions that are padding: ``1 - Σ lengths / Σ rows_b · width_b``."""
    computed = sum(len(b.rows) * b.width for b in buckets)
    return 1.0 - float(np.sum(lengths)) / computed if computed else 0.0
