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

The call cost depends on the device. On a CPU a pass's fixed cost is small next to its compute (47 positions
measured at 0.33M parameters, `benchmarks/bucket_call_cost.py`), so the default there is the constant
`DEFAULT_CALL_COST_TOKENS`. On a GPU a pass's kernel launches and Python weigh thousands of positions (an H200 ran
a 0.5B model 7x slower with 64 than with one padded pass), so there the learner measures it on its own device when
it starts (`measure_call_cost`: timed passes at two widths; cached per device and model) and counts it twice
(`planned_call_cost`: a split must pay for itself twice over), and a measurement that fails or runs out of time
counts as an infinite cost (one pass, padded): the plan never has more passes than the measured costs justify.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

# One more forward/backward call costs about as much as this many token positions (the model's Python and kernel
# launches). `benchmarks/bucket_call_cost.py` measured 47 positions for a 0.33M-parameter model on CPU, and for
# 2.44M and 10M a per-call cost within the fit's noise of zero: 64 errs toward fewer calls.
DEFAULT_CALL_COST_TOKENS = 64
# ``length_buckets="measure"``: measure the call cost on the learner's device, whatever the device.
MEASURE = "measure"
# The measurement (`measure_call_cost`): rows per timed pass, the two widths (capped by the model's context), the
# timed repeats per width (the fastest counts: noise only adds time) and the wall-clock bound on all of it.
MEASURE_ROWS = 4
MEASURE_WIDTHS = (256, 1024)
MEASURE_REPEATS = 3
MEASURE_BUDGET_S = 60.0
# A measured call cost is counted twice in the plan: a split must save twice what the fit says a pass costs. The fit
# is linear, but a narrow bucket on a GPU runs below the device's throughput (an H200 ran a 0.5B model's batch of
# long rows fastest in one pass even at 16384 positions per pass), and a wrong split costs more than a missed one.
MEASURED_CALL_COST_MARGIN = 2.0


def bucket_call_cost(setting: Union[bool, float, str]) -> Optional[float]:
    """The call cost the model config's ``length_buckets`` asks for: ``True`` the default
    (`DEFAULT_CALL_COST_TOKENS` on a CPU; on other devices the learner measures it instead, see the module
    docstring), ``"measure"`` measured on any device (None here: the learner measures), ``False`` none of it (an
    infinite call cost: every batch runs padded to its longest row), a number that call cost in token positions
    (0: a bucket per distinct length)."""
    if isinstance(setting, bool):
        return DEFAULT_CALL_COST_TOKENS if setting else float("inf")
    if setting == MEASURE:
        return None
    if isinstance(setting, (int, float)) and setting >= 0:
        return float(setting)
    raise ValueError(
        "length_buckets must be True, False or a call cost in token positions (a number >= 0), or 'measure', "
        f"got {setting!r}"
    )


def planned_call_cost(measured: float) -> float:
    """The call cost the plan counts for a measured one: ``MEASURED_CALL_COST_MARGIN · measured``."""
    return MEASURED_CALL_COST_MARGIN * measured


def measure_call_cost(
    run_pass: Callable[[int, int], None],
    rows: int = MEASURE_ROWS,
    widths: Tuple[int, int] = MEASURE_WIDTHS,
    *,
    repeats: int = MEASURE_REPEATS,
    budget_s: float = MEASURE_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
) -> Optional[float]:
    """A pass's fixed cost in token positions, from timed passes ``run_pass(rows, width)`` at two widths.

    With ``t(w) = c + p · rows · w`` (a fixed cost ``c`` per pass, ``p`` per token position) and the fastest time of
    ``repeats`` passes at each width ``w1 < w2``::

        p = (t(w2) - t(w1)) / (rows · (w2 - w1)),    call cost = c / p = t(w1) / p - rows · w1

    clipped at 0; infinite when the wider pass was not slower (all overhead). One untimed pass at each width first
    (allocations, kernel selection, compilation). ``sync`` waits for the device (``torch.cuda.synchronize``) around
    each timed pass. Returns None when the warm-up already used ``budget_s`` (nothing timed); timed passes stop at
    the bound, and the estimate uses those done (at least one per width, else None)."""
    w1, w2 = sorted(widths)
    if w1 == w2:
        raise ValueError(f"measure_call_cost needs two different widths, got {widths}")
    start = clock()
    for w in (w1, w2):
        sync()
        run_pass(rows, w)
    sync()
    times: Dict[int, List[float]] = {w1: [], w2: []}
    for _ in range(repeats):
        for w in (w1, w2):
            if clock() - start > budget_s:
                break
            t0 = clock()
            run_pass(rows, w)
            sync()
            times[w].append(clock() - t0)
    if not times[w1] or not times[w2]:
        return None
    t1, t2 = min(times[w1]), min(times[w2])
    per_position = (t2 - t1) / (rows * (w2 - w1))
    if per_position <= 0 or not math.isfinite(per_position):
        return float("inf")
    return max(0.0, t1 / per_position - rows * w1)


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
