"""The one rule behind every results sentence that says a method wins, ties, loses, is best or collapses.

Pure Python (no pandas, no torch), so a page generator, the sweep report and the results check all import the same
words and the same arithmetic:

- **tie**: two methods' means over seeds differ by at most the *standard error of their difference*,
  ``SE = sqrt(s_a²/n_a + s_b²/n_b)`` (sample standard deviations, ``ddof = 1``, over ``n`` seeds); beyond it, the
  higher mean wins. A std that is NaN (a single seed) counts as 0.
- **best**: the method with the highest mean; every method that ties with it (the rule above) is "best or tied".
  A regime where every method is best or tied shows no difference between them: it is evidence for none.
- **P3O's default** (`CHOICE_RULE`, `choose_default`): chosen on the development set, by the rules above.
- **collapse** (the claims bench's rule): a trial errored, or its last held-out accuracy is more than
  `COLLAPSE_DROP` below the best held-out accuracy it reached.

Statistics are ``(mean, std, n)`` triples; a pair ``(mean, std)`` counts as ``n = 1`` (no spread from the seeds).
"""

from __future__ import annotations

import math
from typing import Hashable, Literal, Mapping, Sequence, Tuple, TypeVar, Union

Verdict = Literal["wins", "ties", "loses"]
K = TypeVar("K", bound=Hashable)
Stats = Union[Tuple[float, float], Tuple[float, float, int]]

COLLAPSE_DROP = 0.1
TIE_RULE = (
    "Two methods tie when their means over seeds differ by at most the standard error of the difference, "
    "sqrt(s_a²/n_a + s_b²/n_b) with s the sample standard deviation over n seeds; beyond it the higher mean wins. "
    "The best method of a row is the highest mean, and every method that ties with it is best or tied; a row where "
    "all methods are best or tied shows no difference between them."
)
COLLAPSE_RULE = (
    f"A trial collapses when it errored or its last held-out accuracy is more than {COLLAPSE_DROP:g} below the best "
    "held-out accuracy it reached."
)


def _spread(std: float) -> float:
    """A std as a spread: NaN (one seed, no sample std) is 0; a negative std is an error."""
    if math.isnan(std):
        return 0.0
    if std < 0:
        raise ValueError(f"a standard deviation is >= 0, got {std}")
    return float(std)


def _triple(stats: Stats) -> Tuple[float, float, int]:
    mean, std, *n = stats
    return float(mean), _spread(float(std)), int(n[0]) if n else 1


def standard_error(std_a: float, n_a: int, std_b: float, n_b: int) -> float:
    """``sqrt(s_a²/n_a + s_b²/n_b)``: the standard error of the difference of two means over seeds."""
    if n_a < 1 or n_b < 1:
        raise ValueError(f"a mean needs at least one seed, got n = {n_a} and {n_b}")
    return math.sqrt(_spread(std_a) ** 2 / n_a + _spread(std_b) ** 2 / n_b)


def verdict(a: Stats, b: Stats) -> Verdict:
    """A against B under `TIE_RULE`, each ``(mean, std, n)``: ``"ties"`` when ``|mean_a - mean_b| <= SE`` (the
    standard error of the difference), else ``"wins"`` if A has the higher mean and ``"loses"`` if the lower."""
    mean_a, std_a, n_a = _triple(a)
    mean_b, std_b, n_b = _triple(b)
    if math.isnan(mean_a) or math.isnan(mean_b):
        raise ValueError(f"a verdict needs two means, got {mean_a} and {mean_b}")
    if abs(mean_a - mean_b) <= standard_error(std_a, n_a, std_b, n_b):
        return "ties"
    return "wins" if mean_a > mean_b else "loses"


def best_or_tied(stats: Mapping[K, Stats]) -> list[K]:
    """The keys of ``stats`` (``key -> (mean, std, n)``) that are the best or tie with it under `TIE_RULE`: the
    highest mean, and every key whose `verdict` against it is ``"ties"``; in the mapping's order. NaN means are
    left out (no trial, no verdict)."""
    scored = {key: _triple(s) for key, s in stats.items() if not math.isnan(float(s[0]))}
    if not scored:
        return []
    best = max(scored, key=lambda key: scored[key][0])
    return [key for key, s in scored.items() if verdict(s, scored[best]) == "ties"]


def all_tie(stats: Mapping[K, Stats]) -> bool:
    """Whether every method with a mean is best or tied (`best_or_tied`): such a row is no evidence for any of them.
    False for fewer than two methods."""
    scored = [k for k, s in stats.items() if not math.isnan(float(s[0]))]
    return len(scored) > 1 and len(best_or_tied(stats)) == len(scored)


def collapsed(last: float, best: float, errored: bool = False) -> bool:
    """`COLLAPSE_RULE`: the trial errored, has no last held-out (NaN) or its ``last`` held-out is more than
    `COLLAPSE_DROP` below its ``best``."""
    return errored or math.isnan(last) or last < best - COLLAPSE_DROP


CHOICE_RULE = (
    "P3O's default is chosen among the candidates on the development set alone: a candidate with a collapsed seed in "
    "any development regime is out; of the others, the one best or tied in the most development regimes wins; a tie "
    "goes to the higher mean held-out over those regimes, then to the candidate listed first (the fewer changes)."
)


def choose_default(
    stats: Mapping[str, Mapping[K, Stats]], collapses: Mapping[str, Mapping[K, int]], candidates: Sequence[K]
) -> K:
    """`CHOICE_RULE`: ``stats[regime][method]`` are ``(mean, std, n)`` over seeds of every method of the development
    set, ``collapses[regime][method]`` its collapsed seeds; returns the chosen candidate. Raises ValueError when
    every candidate collapsed somewhere."""
    regimes = list(stats)
    kept = [c for c in candidates if not any(collapses[r].get(c, 0) for r in regimes)]
    if not kept:
        raise ValueError(f"every candidate ({', '.join(map(str, candidates))}) collapsed in a development regime")
    wins = {c: sum(c in best_or_tied(stats[r]) for r in regimes) for c in kept}
    mean = {c: sum(float(stats[r][c][0]) for r in regimes) / len(regimes) for c in kept}
    return max(kept, key=lambda c: (wins[c], mean[c], -list(candidates).index(c)))
