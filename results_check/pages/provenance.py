"""docs/results/provenance.md: offline data read by their provenance, from the claims bench's provenance round: its
development set (`results/bench-provenance-development`: `summary.json`, `curves.csv`, `lr_choice.json`, `trials/`)
and its confirmation set (`results/bench-provenance-confirmation`; a partial set's finished regimes only), with the
diagnosis of its learning rate where the default is behind (`results/bench-provenance-confirmation-rate`).

What the page says is derived here: each method's learning rate per lr family, the regime × method matrix (cells
labelled, the standard-error rule stated), the ablation in `offline_weaker` that says which of P3O's terms held it back
there and by how much, the count of distinct trials, and the default's standing on each set by
`rllib_p3o.sweep.verdicts`.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Tuple

import pandas as pd

from results_check.page import Page
from results_check.pages._fmt import info_box_tail, load_json, pm, table, words
from results_check.pages._paths import (
    BENCH_PROVENANCE_CONFIRMATION,
    BENCH_PROVENANCE_DEVELOPMENT,
    BENCH_PROVENANCE_FIRST_CONFIRMATION,
    BENCH_PROVENANCE_RATE,
)
from results_check.pages.staleness import Grid, aim_quotes, best_method, complete, load, matrix_quotes, standing
from rllib_p3o.sweep.grid import (
    ABLATION_METHODS,
    DEFAULT_METHOD,
    FIRST_CHOICE,
    GRIDS,
    LAGGING_ROWS,
    LR_FAMILY_REGIMES,
    METHODS,
    ON_POLICY_FAMILY,
    OTHER_MODEL_CANDIDATES,
    OTHER_MODEL_FAMILY,
    OTHER_MODEL_ROWS,
    OWN_STALE_FAMILY,
    PROVENANCE_DEVELOPMENT_METHODS,
    REGIMES,
    SECOND_CHOICE,
    STALENESS_DEFAULT,
    canonical_method,
    family_key,
    method_peak,
)
from rllib_p3o.sweep.grid import Grid as SweepGrid
from rllib_p3o.sweep.verdicts import (
    CHOICE_RULE,
    COLLAPSE_RULE,
    TIE_RULE,
    all_tie,
    best_or_tied,
    choose_default,
    standard_error,
    verdict,
)

DEVELOPMENT = GRIDS["sorting", "development"]
CONFIRMATION = GRIDS["sorting", "confirmation"]
FIRST_CONFIRMATION = GRIDS["sorting", "first-choice-confirmation"]
# How the page names each lr family (`rllib_p3o.sweep.grid.LR_FAMILY_REGIMES`: the regime its rate is chosen in).
FAMILY_NAMES = {
    ON_POLICY_FAMILY: "on-policy",
    OWN_STALE_FAMILY: "the policy's own stale data",
    OTHER_MODEL_FAMILY: "another model's data",
}
ABLATION_REGIME = "offline_weaker"
CELL_LABEL = (
    "Each cell: held-out accuracy at the budget, mean ± SD over the seeds (SD: the sample standard deviation), "
    "best or tied in bold"
)
# What each ablation form does with the recording (read as the policy's own lagging rows, as before provenance).
_REGION = {"ess_clip": "on", "none": "off"}
_ANCHOR = {"behavior": "the recorder (π_b)", "proximal": "π_old", "none": "none"}
_SAID = {"wins": "ahead", "loses": "behind", "ties": "tied"}  # a verdict of B against A, as the page says it


def lr_quotes(
    root: str, folder: str = BENCH_PROVENANCE_DEVELOPMENT, methods: Tuple[str, ...] = PROVENANCE_DEVELOPMENT_METHODS
) -> List[str]:
    """Each method's chosen peak lr per lr family and the peaks each family's bracket tried."""
    choice = load_json(root, f"{folder}/lr_choice.json")
    families = [f for f in LR_FAMILY_REGIMES if f in choice["families"]]
    rows = []
    for method in methods:
        rows.append([f"`{method}`", *[f"{choice['lr_peak'][family_key(method, f)]:g}" for f in families]])
    header = ["method", *[f"{FAMILY_NAMES[f]} (`{choice['families'][f]['regime']}`)" for f in families]]
    tried = [f"{FAMILY_NAMES[f]}: {', '.join(f'{p:g}' for p in choice['families'][f]['peaks'])}" for f in families]
    out = [*table(header, rows), f"Peak learning rates tried, per family: {'; '.join(tried)}"]
    edges = []
    for f in families:
        peaks = choice["families"][f]["peaks"]
        for method, scores in choice["families"][f]["scores"].items():
            chosen = choice["lr_peak"][family_key(method, f)]
            tried_here = sorted(float(p) for p in scores)
            if len(tried_here) > 1 and chosen in (tried_here[0], tried_here[-1]) and chosen in (peaks[0], peaks[-1]):
                edges.append(f"`{method}` ({FAMILY_NAMES[f]}, {chosen:g})")
    if edges:
        out.append(
            "Best at an end of the bracket after its last extension, so the peak may lie beyond it: " + words(edges)
        )
    return out


def distinct_trials(root: str, folder: str) -> int:
    """How many trials the set ran: one file per trial under ``trials/<stage>/`` (a trial two cells share counts once)."""
    out = os.path.join(root, folder, "trials")
    return sum(len([f for f in files if f.endswith(".csv")]) for _, _, files in os.walk(out))


def main_grid(g: Grid) -> Grid:
    """``g`` without the ablation forms (they have their own table)."""
    methods = [m for m in g.methods if m not in ABLATION_METHODS]
    keep = lambda d: {r: {m: v for m, v in d[r].items() if m in methods} for r in d}  # noqa: E731
    rows = {k: v for k, v in g.rows.items() if k[1] in methods}
    return Grid(g.folder, g.report, rows, g.regimes, methods, keep(g.stats), keep(g.collapses), g.curves)


def _diag(g: Grid, method: str, column: str) -> float:
    rows = g.curves[(g.curves["stage"] == ABLATION_REGIME) & (g.curves["method"] == method)]
    return float(rows[column].mean()) if column in rows and not rows[column].isna().all() else math.nan


def _fmt(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def ablation_quotes(g: Grid) -> List[str]:
    """The ablation's table (each form's settings, held-out, collapses and diagnostics) and what it shows."""
    stats = g.stats[ABLATION_REGIME]
    start = [r["heldout_start_mean"] for (s, _), r in g.rows.items() if s == ABLATION_REGIME]
    rows = []
    for m in (*ABLATION_METHODS, STALENESS_DEFAULT):
        config = METHODS[m]["loss_config"]
        own = m in ABLATION_METHODS
        rows.append(
            [
                f"`{m}`",
                "the policy's own" if own else "another model's",
                _REGION[config["trust_region"]] if own else "off (another model's rows)",
                _ANCHOR[config["kl_anchor"]] if own else "π_old (another model's rows)",
                pm(*stats[m][:2]),
                f"{g.collapses[ABLATION_REGIME][m]}/{stats[m][2]}",
                _fmt(_diag(g, m, "masked_fraction")),
                _fmt(_diag(g, m, "kl_grad_share")),
            ]
        )
    header = [
        "form",
        "recording read as",
        "trust region",
        "KL anchor",
        "held-out (mean ± SD)",
        "collapsed",
        "tokens stopped",
        "KL share of the gradient",
    ]
    return [
        f"The recording's held-out accuracy at the start: {sum(start) / len(start):.3f} (mean over the forms' trials)",
        *table(header, rows),
        *effect_quotes(stats),
    ]


def effect(stats: Dict[str, Tuple[float, float, int]], a: str, b: str) -> Tuple[float, float, str]:
    """``mean_b − mean_a``, the standard error of that difference and the verdict of b against a."""
    (ma, sa, na), (mb, sb, nb) = stats[a], stats[b]
    return mb - ma, standard_error(sa, na, sb, nb), verdict(stats[b], stats[a])


def effect_quotes(stats: Dict[str, Tuple[float, float, int]]) -> List[str]:
    """Each term's effect, one change from the form P3O had before provenance (`p3o_own_clip_recorder`)."""
    before = "p3o_own_clip_recorder"
    changes = [
        ("p3o_own_free_recorder", "without the trust region"),
        ("p3o_own_clip_prox", "with the KL toward π_old instead of the recorder"),
        ("p3o_own_clip_nokl", "without the KL term"),
        ("p3o_own_free_nokl", "without both"),
        (STALENESS_DEFAULT, "reading the recording as another model's (P3O's default of the staleness round)"),
    ]
    parts = []
    for method, what in changes:
        diff, se, v = effect(stats, before, method)
        parts.append(f"{what}: {diff:+.3f} (SE {se:.3f}, {_SAID[v]})")
    return [
        f"Against P3O as it read this recording before provenance (`{before}`), held-out at the budget: "
        + "; ".join(parts)
    ]


# The three choices of the weight on another model's tokens: the first over the development set's first three regimes
# and the first two candidates; the second over all its regimes (a live weaker model added) and the first three; the
# third over all its regimes and every candidate (the truncation alone, the cap beside the policy's own, added).
FIRST_CHOICE_REGIMES = tuple(LR_FAMILY_REGIMES.values())
FIRST_CANDIDATES = (STALENESS_DEFAULT, *OTHER_MODEL_CANDIDATES[:2])
SECOND_CANDIDATES = (STALENESS_DEFAULT, *OTHER_MODEL_CANDIDATES[:3])
THIRD_CANDIDATES = (STALENESS_DEFAULT, *OTHER_MODEL_CANDIDATES)


def choice_quotes(
    g: Grid, candidates: Tuple[str, ...], regimes: Tuple[str, ...], expected: str, name: str
) -> List[str]:
    """A choice of the weight on another model's tokens by `CHOICE_RULE` among ``candidates`` over ``regimes`` of the
    development set; raises unless the rule picks ``expected`` (what the grids name)."""
    stats = {r: g.stats[r] for r in regimes}
    chosen = choose_default(stats, {r: g.collapses[r] for r in regimes}, candidates)
    if chosen != expected:
        raise ValueError(f"the rule chooses {chosen}, but the grids name {expected}")
    counts = []
    for c in candidates:
        held = sum(c in best_or_tied(stats[r]) for r in regimes)
        mean = sum(stats[r][c][0] for r in regimes) / len(regimes)
        form = METHODS[c]["loss_config"]["other_model_weight"]
        counts.append(f"`{c}` (`{form}`) best or tied in {held} of {len(regimes)}, mean {mean:.4f}")
    return [f"The {name} over {words([f'`{r}`' for r in regimes])}: {words(counts)}; the rule chooses `{chosen}`"]


def ess_quote(g: Grid) -> str:
    ess = _diag(g, STALENESS_DEFAULT, "ess")
    return (
        f"On `{ABLATION_REGIME}`'s recording the mean ESS of `{STALENESS_DEFAULT}`'s batches is {ess:.3f}: its cap "
        "weights no token of it above that"
    )


def first_choice(g: Grid) -> List[str]:
    return choice_quotes(g, FIRST_CANDIDATES, FIRST_CHOICE_REGIMES, FIRST_CHOICE, "first choice")


def second_choice(g: Grid) -> List[str]:
    return choice_quotes(g, SECOND_CANDIDATES, tuple(g.regimes), SECOND_CHOICE, "second choice")


def third_choice(g: Grid) -> List[str]:
    return choice_quotes(g, THIRD_CANDIDATES, tuple(g.regimes), DEFAULT_METHOD, "third choice")


def change_regimes(grid_regimes: Tuple[str, ...]) -> List[str]:
    """The regimes where P3O's default computes another loss than the staleness round's default (another model wrote
    rows there)."""
    return [
        r
        for r in grid_regimes
        if canonical_method(DEFAULT_METHOD, REGIMES[r]) != canonical_method(STALENESS_DEFAULT, REGIMES[r])
    ]


def change_quotes(grid: SweepGrid, root: str) -> List[str]:
    """Where the choice changes P3O's update on ``grid``: its loss, or only its learning rate (the same loss as the
    staleness round's default at its family's rate, chosen where the two differ), or nothing (they share trials)."""
    regimes = grid.regimes
    acts = change_regimes(regimes)
    rate = [
        r
        for r in regimes
        if r not in acts and grid.same_run_as(r, DEFAULT_METHOD) != grid.same_run_as(r, STALENESS_DEFAULT)
    ]
    same = len(regimes) - len(acts) - len(rate)
    out = [
        f"The choice changes P3O's loss in {len(acts)} of the {len(regimes)} regimes "
        f"({words([f'`{r}`' for r in acts])}, where a minibatch holds only another model's rows)"
    ]
    if rate:
        peaks = load_json(root, f"{BENCH_PROVENANCE_DEVELOPMENT}/lr_choice.json")["lr_peak"]
        family = OTHER_MODEL_FAMILY
        out.append(
            f"In {len(rate)} ({words([f'`{r}`' for r in rate])}, a live model beside the policy's own rows) it computes "
            f"the staleness round's default's loss, `{STALENESS_DEFAULT}`'s, at its own family's learning rate "
            f"({peaks[family_key(DEFAULT_METHOD, family)]:g} against {peaks[family_key(STALENESS_DEFAULT, family)]:g}), "
            "so the two run apart"
        )
    out.append(f"In the other {same} it computes `{STALENESS_DEFAULT}`'s update and shares its trials")
    return out


def load_complete(root: str, folder: str, grid: SweepGrid, name: str) -> Grid:
    """A set's files, which must be there and complete (ValueError naming ``name`` otherwise)."""
    g = load(root, folder, grid)
    if g is None:
        raise ValueError(f"no {folder}/summary.json")
    if g.note:
        raise ValueError(f"{name} is partial: {g.note}")
    return g


def quotes(root: str) -> List[str]:
    dev = load_complete(root, BENCH_PROVENANCE_DEVELOPMENT, DEVELOPMENT, "the development set")
    seeds = len(DEVELOPMENT.seeds)
    out = [
        *lr_quotes(root),
        CELL_LABEL,
        *matrix_quotes(main_grid(dev)),
        TIE_RULE,
        COLLAPSE_RULE,
        f"The development set ran {distinct_trials(root, BENCH_PROVENANCE_DEVELOPMENT)} distinct trials",
        *aim_quotes(main_grid(dev), "development", seeds, DEFAULT_METHOD),
        *ablation_quotes(dev),
        ess_quote(dev),
        *first_choice(main_grid(dev)),
        *first_confirmation_quotes(root),
        *second_choice(main_grid(dev)),
        *third_choice(main_grid(dev)),
        *change_quotes(CONFIRMATION, root),
    ]
    confirmed = readme_confirmation(root)
    return [
        *out,
        *confirmation_quotes(root),
        *([confirmed] if confirmed else []),
        *rate_quotes(root),
        *aim_verdict_quotes(root),
    ]


def confirmation_quotes(root: str) -> List[str]:
    g: Optional[Grid] = load(root, BENCH_PROVENANCE_CONFIRMATION, CONFIRMATION)
    if g is None:
        return ["The confirmation set has not run yet"]
    seeds = len(CONFIRMATION.seeds)
    done = complete(g, seeds, DEFAULT_METHOD, CONFIRMATION)
    out = ([g.note] if g.note else []) + [CELL_LABEL, *matrix_quotes(g, done)]
    if not done:
        return out + ["No regime of the confirmation set has all its trials yet, so it confirms nothing so far"]
    regimes_said = words([f"`{r}`" for r in done])
    return out + [
        *([f"The confirmation set's finished regimes: {regimes_said}"] if len(done) < len(g.regimes) else []),
        *aim_quotes(g, "confirmation", seeds, DEFAULT_METHOD),
        scope_quote(g, done),
        start_quote(g, done),
        *choice_confirmed(
            g,
            done,
            STALENESS_DEFAULT,
            DEFAULT_METHOD,
            "P3O's default against the staleness round's (the weight on a recording trained alone, the learning rate "
            "with a live model)",
        ),
        *choice_confirmed(g, done, SECOND_CHOICE, DEFAULT_METHOD, "The third choice against the second"),
        *choice_confirmed(
            g, done, "p3o_clip", STALENESS_DEFAULT, "One ESS per policy version (against one per source)"
        ),
        f"The confirmation set ran {distinct_trials(root, BENCH_PROVENANCE_CONFIRMATION)} distinct trials",
    ]


def scope_groups(regimes: List[str]) -> Dict[str, List[str]]:
    """The regimes by which of P3O's default's additions to its base loss acts there: another model wrote rows (its
    weight on them), the policy's own tokens lag (its trust region), or neither (one policy version, no other
    model)."""
    groups: Dict[str, List[str]] = {"other": [], "lagging": [], "plain": []}
    for r in regimes:
        traits = REGIMES[r].traits
        groups["other" if OTHER_MODEL_ROWS in traits else "lagging" if LAGGING_ROWS in traits else "plain"].append(r)
    return groups


def scope_quote(g: Grid, regimes: List[str], default: str = DEFAULT_METHOD) -> str:
    """The default's standing counted apart where its trust region acts, where its weight on another model's rows
    acts and where neither does. The grouping comes from the regimes' traits and is checked against
    the files: the tokens the trust region stopped are above 0 in every lagging regime and 0 in the others."""
    groups = scope_groups(regimes)
    for r in regimes:
        stopped = g.curves[(g.curves["stage"] == r) & (g.curves["method"] == default)]["masked_fraction"].mean()
        if (stopped > 0) != (r in groups["lagging"]):
            raise ValueError(f"{r}: the trust region stopped {stopped:.4f} of the default's tokens, against its traits")
    held = [r for r in regimes if default in best_or_tied(g.stats[r])]
    ties = [r for r in regimes if all_tie(g.stats[r])]

    def count(group: str) -> str:
        rs = groups[group]
        tied = [r for r in rs if r in ties]
        all_said = f", {len(tied)} of them a regime where every method ties" if tied else ""
        return f"{sum(r in held for r in rs)} of {len(rs)}{all_said}"

    return (
        f"Counted by what the default changes: where its trust region acts (the policy's own tokens lag: "
        f"{words([f'`{r}`' for r in groups['lagging']])}) it is best or tied in {count('lagging')}; where its weight on "
        f"another model's rows acts ({words([f'`{r}`' for r in groups['other']])}) in {count('other')}; where "
        f"neither acts (one policy version, no other model: "
        f"{words([f'`{r}`' for r in groups['plain']])}) in {count('plain')}"
    )


def start_quote(g: Grid, regimes: List[str], default: str = DEFAULT_METHOD) -> str:
    """Where another model wrote rows, the default's held-out accuracy at its first evaluation (iteration 1, the
    start that the staleness round's default fell below on a weaker model's recording) and at the budget, means over
    seeds, and in how many seeds it ends above that start."""
    said = []
    for r in scope_groups(regimes)["other"]:
        per_seed = _first_and_last(g, r, default)
        above = int((per_seed["last"] > per_seed["first"]).sum())
        said.append(
            f"`{r}` {per_seed['first'].mean():.3f} → {per_seed['last'].mean():.3f}, above its start in {above} of "
            f"{len(per_seed)} seeds"
        )
    return (
        "Where another model wrote rows, P3O's default's held-out accuracy at its first evaluation (iteration 1) and "
        f"at the budget: {'; '.join(said)}"
    )


def rate_quotes(
    root: str,
    rate_folder: str = BENCH_PROVENANCE_RATE,
    confirmation_folder: str = BENCH_PROVENANCE_CONFIRMATION,
    grid: SweepGrid = CONFIRMATION,
) -> List[str]:
    """Where P3O's default is behind on a confirmation set (``confirmation_folder``, run by ``grid``), the same update
    on the same seeds at the learning rate of the regime's highest mean (``rate_folder``): how much of the gap its
    family's rate makes. A diagnosis, not a choice: nothing was changed by it."""
    rate = load(root, rate_folder)
    conf = load(root, confirmation_folder, grid)
    if rate is None or conf is None:
        return []
    rate_lr = float(rate.report["lr_peak"])
    finished = complete(conf, len(grid.seeds), DEFAULT_METHOD, grid)
    out = []
    for regime in rate.regimes:
        if regime not in finished:
            raise ValueError(f"{rate_folder} ran `{regime}`, which the confirmation set has not finished")
        for method in rate.methods:
            if grid.same_run_as(regime, method) != grid.same_run_as(regime, DEFAULT_METHOD):
                raise ValueError(f"`{method}` does not compute P3O's default's update in `{regime}`")
            best = max(conf.stats[regime], key=lambda m: conf.stats[regime][m][0])
            if not math.isclose(method_peak(conf.report["lr_peak"], best, regime), rate_lr):
                raise ValueError(f"{rate_folder} ran `{regime}` at {rate_lr:g}, not at `{best}`'s rate")
            stats = {"own": conf.stats[regime][DEFAULT_METHOD], "rate": rate.stats[regime][method]}
            stats["best"] = conf.stats[regime][best]
            own_lr = method_peak(conf.report["lr_peak"], DEFAULT_METHOD, regime)
            gain, gain_se, _ = effect(stats, "own", "rate")
            gap, gap_se, v = effect(stats, "best", "rate")
            collapses = rate.collapses[regime][method]
            out.append(
                f"`{regime}`: P3O's default at {rate_lr:g}, the rate of `{best}` (the regime's highest mean), scores "
                f"{pm(*stats['rate'])} ({collapses} of {stats['rate'][2]} seeds collapsed), against "
                f"{pm(*stats['own'])} at its family's rate {own_lr:g} ({gain:+.3f}, SE {gain_se:.3f}); against `{best}` "
                f"({pm(*stats['best'])}) it is {_SAID[v]} ({gap:+.3f}, SE {gap_se:.3f})"
            )
    return out


# The aim on the confirmation set: ahead of every peer's default by more than the SE in at least this many
# regimes where the data drift (every regime but on-policy).
AIM_AHEAD_AT_LEAST = 3


def aim_verdict_quotes(root: str) -> List[str]:
    """The aim on the complete confirmation set, met or not, and for each regime where P3O's default is behind, what
    isolates why: the same update at the rate of the regime's highest mean (`rate_quotes`' diagnosis), or, where it
    computes the staleness round's default's loss at another rate, that loss at its own rate (the confirmation's
    `STALENESS_DEFAULT` cells). A regime behind with neither says so. Nothing while the set is partial."""
    g = load(root, BENCH_PROVENANCE_CONFIRMATION, CONFIRMATION)
    if (
        g is None
        or g.note
        or len(complete(g, len(CONFIRMATION.seeds), DEFAULT_METHOD, CONFIRMATION)) < len(CONFIRMATION.regimes)
    ):
        return []
    regimes = list(g.regimes)
    held, missed, ahead, collapsed = standing(g, regimes, DEFAULT_METHOD)
    drift = [r for r in ahead if r != LR_FAMILY_REGIMES[ON_POLICY_FAMILY]]  # every regime but on-policy
    others = scope_groups(regimes)["other"]
    starts = [_above_start(g, r) for r in others]
    met = not missed and len(drift) >= AIM_AHEAD_AT_LEAST and not collapsed and all(starts)
    seeds = sum(g.stats[r][DEFAULT_METHOD][2] for r in regimes)
    out = [
        f"The aim on the confirmation set (P3O's default best or tied in every regime, above its start where another "
        f"model wrote rows, ahead of every peer's default by more than the standard error in at least "
        f"{AIM_AHEAD_AT_LEAST} regimes where the data drift, no collapsed seed) is {'met' if met else 'not met'}: it "
        f"is behind in {len(missed)} of {len(regimes)} regimes, ahead of every peer's default in {len(drift)} where "
        f"the data drift, above its start in {sum(starts)} of the {len(others)} regimes where another model wrote "
        f"rows, and {collapsed} of its {seeds} seeds collapsed"
    ]
    rate = load(root, BENCH_PROVENANCE_RATE)
    for r in missed:
        best = best_method(g, r)
        gap = g.stats[r][DEFAULT_METHOD][0] - g.stats[r][best][0]
        said = f"`{r}` ({gap:+.3f} to `{best}`)"
        if rate is not None and r in rate.regimes:
            out.append(
                f"{said}: {_rate_diagnosis(g.stats[r][DEFAULT_METHOD], rate.stats[r][rate.methods[0]], g.stats[r][best], best)}"
            )
        elif CONFIRMATION.same_run_as(r, DEFAULT_METHOD) != CONFIRMATION.same_run_as(r, STALENESS_DEFAULT) and (
            r not in change_regimes(CONFIRMATION.regimes)
        ):
            own_lr = method_peak(g.report["lr_peak"], DEFAULT_METHOD, r)
            same_lr = method_peak(g.report["lr_peak"], STALENESS_DEFAULT, r)
            loss = f"it computes `{STALENESS_DEFAULT}`'s loss at {own_lr:g}, where that method runs at {same_lr:g}"
            out.append(f"{said}: {loss}; {_same_loss_diagnosis(g.stats[r], best, same_lr)}")
        else:
            out.append(f"{said}: no run of this page isolates why")
    return out


_AGAINST = {"wins": "ahead of", "loses": "behind", "ties": "tied with"}  # a verdict of B against A, with A named
Cell = Tuple[float, float, int]  # a method's (mean, SD, seeds) in one regime


def _rate_diagnosis(own: Cell, at_rate: Cell, best: Cell, best_name: str) -> str:
    """What the same update at the best method's rate says of the gap: whether it gains on its own rate beyond the
    SE, and whether it then ties with (or passes) the best."""
    stats = {"own": own, "rate": at_rate, "best": best}
    diff, se, v = effect(stats, "best", "rate")
    gain, gain_se, gained = effect(stats, "own", "rate")
    said = f"the same update at `{best_name}`'s rate is {_AGAINST[v]} it ({diff:+.3f}, SE {se:.3f})"
    if gained != "wins":
        gain_said = f"its gain over its own rate ({gain:+.3f}, SE {gain_se:.3f}) is within the SE"
        if v == "loses":
            return f"{said} and {gain_said}: the rate does not explain the gap"
        return f"{said}, but {gain_said}: inconclusive, the rate may explain it"
    return f"{said}; the rate explains {'part of ' if v == 'loses' else ''}the gap"


def _same_loss_diagnosis(stats: Dict[str, Cell], best: str, rate: float) -> str:
    """Where the default computes `STALENESS_DEFAULT`'s loss at another rate: that loss at its own method's rate
    against the default (the rate's share of the gap, beyond the SE or not) and against the regime's best."""
    if best == STALENESS_DEFAULT:
        return f"at {rate:g} that loss is the regime's best: the rate is the whole gap"
    gain, gain_se, gained = effect(stats, DEFAULT_METHOD, STALENESS_DEFAULT)
    diff, se, v = effect(stats, best, STALENESS_DEFAULT)
    said = f"at {rate:g} that loss scores {pm(*stats[STALENESS_DEFAULT])}, {_AGAINST[v]} `{best}` ({diff:+.3f}, SE {se:.3f})"
    if gained != "wins":
        return f"{said}, and not ahead of the default beyond the SE ({gain:+.3f}, SE {gain_se:.3f}): the rate does not explain the gap"
    if v != "loses":
        return f"{said}: the rate is the whole gap"
    return f"{said}: the rate accounts for {gain:.3f} of the gap (SE {gain_se:.3f}), the loss at that rate for the other {-diff:.3f}"


def _first_and_last(g: Grid, regime: str, default: str = DEFAULT_METHOD) -> pd.DataFrame:
    """The default's held-out accuracy per seed in ``regime``: its first evaluation and its last (columns ``first``,
    ``last``)."""
    rows = g.curves[(g.curves["stage"] == regime) & (g.curves["method"] == default)].dropna(subset=["heldout"])
    return rows.sort_values("iteration").groupby("seed")["heldout"].agg(["first", "last"])


def _above_start(g: Grid, regime: str, default: str = DEFAULT_METHOD) -> bool:
    """Whether the default's mean held-out at the budget is above its mean first evaluation in ``regime``."""
    per_seed = _first_and_last(g, regime, default)
    return bool(per_seed["last"].mean() > per_seed["first"].mean())


def first_confirmation_quotes(root: str) -> List[str]:
    """The first choice (`FIRST_CHOICE`) on its confirmation seeds, in the regimes where it acts: the matrix, where it
    stands and what it did against the staleness round's default."""
    g = load_complete(root, BENCH_PROVENANCE_FIRST_CONFIRMATION, FIRST_CONFIRMATION, "the first choice's confirmation")
    seeds = len(FIRST_CONFIRMATION.seeds)
    done = complete(g, seeds, FIRST_CHOICE)
    return [
        CELL_LABEL,
        *matrix_quotes(g, done),
        *aim_quotes(g, "first choice's confirmation", seeds, FIRST_CHOICE, who=f"the first choice (`{FIRST_CHOICE}`)"),
        *choice_confirmed(
            g, done, STALENESS_DEFAULT, FIRST_CHOICE, "The first choice's weight", grid=FIRST_CONFIRMATION
        ),
        f"The first choice's confirmation ran {distinct_trials(root, BENCH_PROVENANCE_FIRST_CONFIRMATION)} distinct "
        "trials",
    ]


def choice_confirmed(
    g: Grid, done: List[str], before: str, chosen: str, what: str, grid: SweepGrid = CONFIRMATION
) -> List[str]:
    """A choice on a confirmation set: ``chosen`` against ``before`` in each finished regime where the two run
    different trials (elsewhere they compute the same update), the difference with its standard error and verdict."""
    parts = []
    for r in done:
        if grid.same_run_as(r, chosen) == grid.same_run_as(r, before):
            continue
        diff, se, v = effect(g.stats[r], before, chosen)
        parts.append(f"`{r}` {diff:+.3f} (SE {se:.3f}, {_SAID[v]})")
    if not parts:
        return [f"{what}: no finished regime of the confirmation set where `{chosen}` and `{before}` differ yet"]
    return [f"{what}, `{chosen}` against `{before}` where they differ: {'; '.join(parts)}"]


PAGE = Page(
    path="docs/results/provenance.md",
    quotes=quotes,
    settings=(
        "seeds 0-2",
        "seeds 0-1",
        "seeds 6-8",
        "seeds 9-11",
        "Seeds 6-8",
        "30 iterations of 512 completions",
        "4 versions old",
    ),
)


# -- writing the page ----------------------------------------------------------------------------------------------

HEADER = (
    """# Data another model recorded

!!! info "How this is measured"
    - **Command:** `rllib-p3o sweep --task sorting --development --parallel 2 --out runs/bench-provenance-development`
      (the development set; its files are in `results/bench-provenance-development/`), then, after the choices it
      informs were committed,
      `rllib-p3o sweep --task sorting --confirmation --parallel 2 --out runs/bench-provenance-confirmation`
      (the confirmation set; `results/bench-provenance-confirmation/`), each in a fresh clone (`git clone`,
      `make install`).
"""
    + info_box_tail("provenance")
    + """
On the [staleness page](staleness.md) P3O's default held wherever the data were the policy's own, however stale, and
fell below its own start on a recording another, weaker model made (`offline_weaker`): every offline file was read
as the policy's own lagging data, so that recording got P3O's trust region and a KL pull toward its recorder. Offline
files now say which model wrote them ([whose data](../guide/offline-and-recording.md#whose-data-the-policys-own-or-another-models)):
a recording the policy's lineage made is its own data; any other, and a file that names no model, is another
model's and is read as a behavior model's rows are. This page chooses each method's learning rate where it runs,
asks which of P3O's terms held it back on another model's recording, chooses how P3O weights that model's tokens,
and checks P3O's default on a confirmation set.
"""
)

LR_INTRO = """## Learning rates: each method's own, per family of regimes

Each method's peak learning rate is chosen by one rule in each family's regime: the peak with the best mean held-out
accuracy at the budget over seeds 0-1, the bracket extended (halved at its bottom, doubled at its top) while a
method's best is at an end of it. The development set's and the confirmation set's trials of a regime train at its
family's rate: on-policy regimes at the on-policy rate, the policy's own stale data (async, several steps per batch,
its own offline recording) at the stale rate, data another model recorded or sampled at the third.
"""

DEVELOPMENT_INTRO = """## The development set

The three lr families' regimes over seeds 0-2, 30 iterations of 512 completions each: `on_policy`, `async_staleness_4`
(async sampling, data up to 4 versions old) and `offline_weaker` (offline only: a recording a weaker checkpoint made,
one per seed, read by its provenance as another model's), every method at its family's learning rate; and, added with
the second choice's candidate ([below](#the-second-choice)), `behavior_weaker` (the same weaker model live, writing
half of each prompt group beside the policy; another model's family).
"""

ABLATION_INTRO = """## Which term held P3O back on another model's recording

The ablation reads the recording of `offline_weaker` as the policy's own lagging data, as P3O did before provenance,
and turns each of the two terms that act only on such rows on and off: the trust region (`ess_clip`) and the KL term's
anchor (the recorder π_b, π_old, or no KL term), each at P3O's default's learning rate, seeds 0-2. P3O's default reads
the same recording as another model's.
"""

CHOICE_INTRO = """## What weights another model's tokens

With the KL pull toward the recorder gone, what was left between P3O and decoupled PPO on another model's recording
is the policy-gradient weight: P3O's cap `min(r, ESS)` holds every token of such a recording at a weight of at most
its ESS (far below one there), so all of them count nearly alike, while decoupled PPO weights each by its importance
ratio and leaves out the largest. Two forms that take their bound from the same ESS, with no coefficient, ran on the
development set after the ablation, each at its own learning rate by the rule above (`other_model_weight`,
[losses guide](../guide/losses.md#another-models-tokens-other_model_weight)): `inverse_ess_cap`, the ratio truncated
at `1/ESS`, and `inverse_ess_mask`, the ratio where it is at most `1/ESS` and no gradient above (AReaL's
behavior-weight mask with the bound the batch gives). They compute the default's update wherever no other model wrote
rows. The choice rule, as on the staleness page:
"""

FIRST_CONFIRMATION_INTRO = """## The first choice on its confirmation seeds

The first choice was committed and run on seeds 6-8 in the two regimes where it acts and the development set did not
cover both: the weaker model's recording (`offline_weaker`) and the same weaker model live, writing half of each
prompt group beside the policy (`behavior_weaker`), every method at its family's learning rate:
`rllib-p3o sweep --task sorting --confirmation --round first-choice --parallel 2 --out runs/bench-provenance-first-confirmation`
(its files are in `results/bench-provenance-first-confirmation/`).
"""

SECOND_CHOICE_INTRO = """## The second choice

With the policy's own tokens in the same groups at full weight, the mask weights the other model's tokens up to
`1/ESS` and they take over the update; the cap held their share to about ESS. The ESS-scaled mask (`ess_scaled_mask`:
`ESS·r` up to `1/ESS`) keeps the mask's shape and the cap's share. It ran on the development set, which gained the
live weaker model (`behavior_weaker`, seeds 0-2, every method at its family's learning rate), and the rule chose again
over all of its regimes. Seeds 6-8 informed this choice, so the confirmation set runs on seeds 9-11.
"""

THIRD_CHOICE_INTRO = """## The third choice

On both sets run so far the truncation was best on a recording trained alone and the cap with a live model beside the
policy's own tokens; the second choice took one of them everywhere. The third candidate (`inverse_ess_cap_alone`)
takes the truncation where a minibatch holds only another model's tokens and the cap where the policy's own are
beside them. It computes the truncation on the recording (and shares its trials there) and the cap with the live
model, at the learning rate its family chose on the recording, so it ran there on seeds 0-2 before the rule chose
again over all four regimes. No trial of the confirmation set had finished when this choice was committed.
"""

CONFIRMATION_INTRO = """## The confirmation set

Every regime of the claims bench over seeds 9-11, run after the development set's choices were committed, each
method at its family's learning rate from the development set: P3O's default as chosen above, and beside it the
second and first choices and the staleness round's default (they share their trials where no other model wrote
rows): `rllib-p3o sweep --task sorting --confirmation --parallel 2 --out runs/bench-provenance-confirmation` (its
files are in `results/bench-provenance-confirmation/`). The regimes where the choices act ran first, with
`--regimes offline_weaker behavior_weaker behavior_stronger` added, then the same command without it ran the others
(a rerun of a command skips the trials it has saved).
"""


RATE_INTRO = """## Where the default is behind: its learning rate

Where P3O's default is behind on the confirmation set and no other model wrote rows, it computes the staleness
round's update at its family's learning rate, chosen in `async_staleness_4`. The same update ran again on the same
seeds at the rate of the regime's highest mean:
`rllib-p3o sweep --task sorting --confirmation --regimes four_steps_per_batch two_steps_per_batch --methods p3o_clip_version --lr 0.00025 --base-model runs/bench-provenance-confirmation/prep/base_model --out runs/bench-provenance-confirmation-rate`
(`p3o_clip_version`'s trials are the default's there; its files are in `results/bench-provenance-confirmation-rate/`).
It is a diagnosis run after the confirmation set, not a choice: no rate was changed by it.
"""


AIM_INTRO = """## The aim, and where it is missed
"""


def page_text(root: str) -> str:
    """The whole page, its prose around the quotes `quotes` derives from the files."""
    dev = load(root, BENCH_PROVENANCE_DEVELOPMENT, DEVELOPMENT)
    seeds = len(DEVELOPMENT.seeds)
    main = main_grid(dev)
    matrix = matrix_quotes(main)
    aim = aim_quotes(main, "development", seeds, DEFAULT_METHOD)
    parts = [
        HEADER,
        f"**In short.** {'; '.join(aim)}. {' '.join(q + '.' for q in ablation_quotes(dev)[-1:])}"
        + (f" Then, {confirmed}." if (confirmed := readme_confirmation(root)) else "")
        + "\n",
        LR_INTRO,
        "\n".join(q for q in lr_quotes(root) if q.startswith("|")) + "\n",
        *[q + ".\n" for q in lr_quotes(root) if not q.startswith("|")],
        DEVELOPMENT_INTRO,
        CELL_LABEL + ".\n",
        "\n".join(q for q in matrix if q.startswith("|")) + "\n",
        *[q + ".\n" for q in matrix if not q.startswith("|")],
        TIE_RULE + " " + COLLAPSE_RULE + "\n",
        f"The development set ran {distinct_trials(root, BENCH_PROVENANCE_DEVELOPMENT)} distinct trials "
        "(a trial two methods share, where they compute the same update, counts once).\n",
        ABLATION_INTRO,
    ]
    ablation = ablation_quotes(dev)
    parts += [ablation[0] + ".\n", "\n".join(q for q in ablation if q.startswith("|")) + "\n", ablation[-1] + ".\n"]
    parts += [CHOICE_INTRO, ess_quote(dev) + ".\n", CHOICE_RULE + "\n", *[q + ".\n" for q in first_choice(main)]]
    first = first_confirmation_quotes(root)
    parts += [FIRST_CONFIRMATION_INTRO, first[0] + ".\n", "\n".join(q for q in first if q.startswith("|")) + "\n"]
    parts += [q + ".\n" for q in first[1:] if not q.startswith("|")]
    parts += [SECOND_CHOICE_INTRO, *[q + ".\n" for q in second_choice(main)]]
    parts += [THIRD_CHOICE_INTRO, *[q + ".\n" for q in third_choice(main)]]
    parts += [q + ".\n" for q in change_quotes(CONFIRMATION, root)]
    parts += [CONFIRMATION_INTRO, *confirmation_text(root)]
    if rate := rate_quotes(root):
        parts += [RATE_INTRO, *[q + ".\n" for q in rate]]
    if aim := aim_verdict_quotes(root):
        parts += [AIM_INTRO, aim[0] + ".\n", "Where it is behind, what isolates why:\n"]
        parts += ["\n".join(f"- {q}." for q in aim[1:]) + "\n"]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def confirmation_text(root: str) -> List[str]:
    """The confirmation section's paragraphs: how far it has run, the cell label and matrix, then its sentences, the
    default's standing in one."""
    confirmation = confirmation_quotes(root)
    g = load(root, BENCH_PROVENANCE_CONFIRMATION, CONFIRMATION)
    aim = aim_quotes(g, "confirmation", len(CONFIRMATION.seeds), DEFAULT_METHOD) if g is not None else []
    if not any(q.startswith("|") for q in confirmation):
        return [q + ".\n" for q in confirmation]
    said = [q for q in confirmation if not q.startswith("|") and q != CELL_LABEL and q not in aim]
    note = [said.pop(0).rstrip(".") + ".\n"] if g.note else []
    table_rows = "\n".join(q for q in confirmation if q.startswith("|")) + "\n"
    standing = ["; ".join(aim) + ".\n"] if aim and aim[0] in confirmation else []
    return [*note, CELL_LABEL + ".\n", table_rows, said[0] + ".\n", *standing, *[q + ".\n" for q in said[1:]]]


def write_page(root: str) -> None:
    with open(os.path.join(root, PAGE.path), "w") as f:
        f.write(page_text(root))


def readme_development(root: str) -> str:
    """README's sentence on the development set: where P3O's default is behind with every method at its family's lr."""
    dev = main_grid(load(root, BENCH_PROVENANCE_DEVELOPMENT, DEVELOPMENT))
    aim = aim_quotes(dev, "development", len(DEVELOPMENT.seeds), DEFAULT_METHOD)
    behind = next((q for q in aim if q.startswith("it is behind")), "it is behind in no regime")
    return (
        "with each method at the rate chosen in its family of regimes and P3O's weight on another model's tokens "
        "chosen there, the provenance round's "
        f"development set finds P3O's default best or tied in {aim[0].split(' best or tied in ')[1]}; {behind}"
    )


def readme_confirmation(root: str) -> Optional[str]:
    """README's clause on the provenance confirmation set's finished regimes (None before any has finished)."""
    g = load(root, BENCH_PROVENANCE_CONFIRMATION, CONFIRMATION)
    done = complete(g, len(CONFIRMATION.seeds), DEFAULT_METHOD, CONFIRMATION) if g is not None else []
    if not done:
        return None
    aim = aim_quotes(g, "confirmation", len(CONFIRMATION.seeds), DEFAULT_METHOD)
    behind = next((q for q in aim if q.startswith("it is behind")), "it is behind in none")
    total = len(CONFIRMATION.regimes)
    to_run = f" ({total - len(done)} of {total} to run)" if len(done) < total else ""
    return (
        f"on its confirmation set (seeds 9-11, run after the choice) the default is best or tied in "
        f"{aim[0].split(' best or tied in ')[1]}{to_run}; {behind}"
    )


if __name__ == "__main__":  # python -m results_check.pages.provenance: after committing a set's files
    write_page(".")
