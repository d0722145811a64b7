"""The one rule behind every results sentence that says a method wins, ties, loses, is best or collapses.

Pure Python (no pandas, no torch), so a page generator, the sweep report and the results check all import the same
words and the same arithmetic:

- **tie**: two methods' means (over seeds) are within the larger of their two *sample* standard deviations
  (``ddof = 1``); outside it, the higher mean wins. A std that is NaN (a single seed) counts as 0.
- **best**: the method with the highest mean; every method that ties with it (the rule above) is "best or tied".
- **collapse** (the claims bench's rule): a trial errored, or its last held-out accuracy is more than
  `COLLAPSE_DROP` below the best held-out accuracy it reached.
"""

from __future__ import annotations

import math
from typing import Hashable, Literal, Mapping, Tuple, TypeVar

Verdict = Literal["wins", "ties", "loses"]
K = TypeVar("K", bound=Hashable)

COLLAPSE_DROP = 0.1
TIE_RULE = (
    "Two methods tie when their means over seeds are within the larger of their two sample standard deviations "
    "(over seeds); otherwise the higher mean wins. The best method of a row is the highest mean, and every method "
    "that ties with it is best or tied."
)
COLLAPSE_RULE = (
    f"A trial collapses when it errored or its last held-out accuracy is more than {COLLAPSE_DROP:g} below the best "
    "held-out accuracy it reached."
)


def _spread(std: float) -> float:
    """A std as a margin: NaN (one seed, no sample std) is 0; a negative std is an error."""
    if math.isnan(std):
        return 0.0
    if std < 0:
        raise ValueError(f"a standard deviation is >= 0, got {std}")
    return float(std)


def tie_margin(std_a: float, std_b: float) -> float:
    """The margin two means must differ by to not tie: ``max(std_a, std_b)`` (sample stds; NaN counts as 0)."""
    return max(_spread(std_a), _spread(std_b))


def verdict(mean_a: float, std_a: float, mean_b: float, std_b: float) -> Verdict:
    """A against B under `TIE_RULE`: ``"ties"`` when ``|mean_a - mean_b| <= max(std_a, std_b)`` (sample stds over
    seeds), else ``"wins"`` if ``mean_a`` is the higher mean and ``"loses"`` if it is the lower."""
    if math.isnan(mean_a) or math.isnan(mean_b):
        raise ValueError(f"a verdict needs two means, got {mean_a} and {mean_b}")
    if abs(mean_a - mean_b) <= tie_margin(std_a, std_b):
        return "ties"
    return "wins" if mean_a > mean_b else "loses"


def best_or_tied(stats: Mapping[K, Tuple[float, float]]) -> list[K]:
    """The keys of ``stats`` (``key -> (mean, sample std)``) that are the best or tie with it under `TIE_RULE`: the
    highest mean, and every key whose `verdict` against it is ``"ties"``; in the mapping's order. NaN means are
    left out (no trial, no verdict)."""
    scored = {key: (mean, std) for key, (mean, std) in stats.items() if not math.isnan(mean)}
    if not scored:
        return []
    best = max(scored, key=lambda key: scored[key][0])
    best_mean, best_std = scored[best]
    return [key for key, (mean, std) in scored.items() if verdict(mean, std, best_mean, best_std) == "ties"]


def collapsed(last: float, best: float, errored: bool = False) -> bool:
    """`COLLAPSE_RULE`: the trial errored, has no last held-out (NaN) or its ``last`` held-out is more than
    `COLLAPSE_DROP` below its ``best``."""
    return errored or math.isnan(last) or last < best - COLLAPSE_DROP
