"""docs/results/addition.md: the claims bench's second task (`rllib_p3o.tasks.addition`), from its development set
(`results/bench-addition-development`: the trial files of its finished learning-rate stages and the sweep's partial
report while it runs).

What the page says is derived here: how the task's completions differ from the sorting task's (from the two tasks'
own rows), the base model's held-out accuracy (every on-policy trial's first evaluation, taken before any update) and
the on-policy learning-rate stage (each method at each peak, mean ± SD over the seeds), the issue's headroom test on
them, each method's rate per lr family (`lr_choice.json`, once written), each set's matrix over its finished regimes
with P3O's default's standing, the aim on the complete confirmation set (with the rates and the learner's diagnostics
where it is missed), how much of each set has run, and the regime × task table of P3O's default's verdicts: the sorting
task's confirmation set (`results/bench-provenance-confirmation`) beside the addition task's development and
confirmation sets (`results/bench-addition-confirmation`, once it runs). A learning-rate stage has finished once the sweep has moved past
it (a later stage has a trial file); until then its bracket may still grow, and the page says so.
"""

from __future__ import annotations

import glob
import os
import shutil
import statistics
from typing import Dict, List, Optional, Tuple

import pandas as pd

from results_check.page import Page
from results_check.pages._fmt import info_box_tail, load_json, machine_words, pm, table, trial_cpus, words
from results_check.pages._paths import (
    BENCH_ADDITION_CONFIRMATION,
    BENCH_ADDITION_DEVELOPMENT,
    BENCH_ADDITION_RATE,
    BENCH_PROVENANCE_CONFIRMATION,
)
from results_check.pages.provenance import (
    CELL_LABEL,
    FAMILY_NAMES,
    distinct_trials,
    effect,
    lr_quotes,
    rate_quotes,
)
from results_check.pages.staleness import (
    PEER_DEFAULTS,
    Grid,
    aim_quotes,
    best_method,
    complete,
    diagnostics_quotes,
    load,
    matrix_quotes,
    standing,
)
from rllib_p3o.sweep import report
from rllib_p3o.sweep.grid import (
    DEFAULT_METHOD,
    GRIDS,
    LR_FAMILY_REGIMES,
    ON_POLICY_FAMILY,
    OTHER_MODEL_CANDIDATES,
    lr_family,
    method_peak,
)
from rllib_p3o.sweep.grid import Grid as SweepGrid
from rllib_p3o.sweep.prep import MODELS, same_weights
from rllib_p3o.sweep.verdicts import COLLAPSE_RULE, TIE_RULE, all_tie, best_or_tied
from rllib_p3o.tasks.addition import AdditionTask
from rllib_p3o.tasks.sorting import SortingTask

DEVELOPMENT = GRIDS["addition", "development"]
CONFIRMATION = GRIDS["addition", "confirmation"]
# The headroom: the base model at most this held-out, the best method on-policy at least this, in the budget.
BASE_AT_MOST, BEST_AT_LEAST = 0.4, 0.8


def lr_stages(grid=DEVELOPMENT) -> List[str]:
    """The development set's learning-rate stages in the order the sweep runs them (one per lr family)."""
    return [f"lr_{r}" for r in LR_FAMILY_REGIMES.values() if r in grid.lr_regimes]


def stage_regime(stage: str) -> str:
    """The regime an lr stage runs in (`rllib_p3o.sweep.run.lr_stage_name` backwards): ``lr_on_policy`` → ``on_policy``."""
    return stage.removeprefix("lr_")


def trial_rows(root: str, stage: str) -> pd.DataFrame:
    """Every iteration of every trial file of ``stage`` (empty when none)."""
    return report.read_trials(os.path.join(root, BENCH_ADDITION_DEVELOPMENT), stage)


def finished_stages(root: str) -> List[str]:
    """The lr stages the sweep has moved past: a later stage (or the main one) has a trial file."""
    stages = lr_stages()
    present = {
        os.path.basename(d)
        for d in glob.glob(os.path.join(root, BENCH_ADDITION_DEVELOPMENT, report.TRIALS_DIR, "*"))
        if glob.glob(os.path.join(d, "*.csv"))
    }
    later_started = [any(p not in stages[: i + 1] for p in present) for i in range(len(stages))]
    return [s for s, done in zip(stages, later_started) if done and s in present]


def task_quotes() -> List[str]:
    """How the task's completions differ from the sorting task's, from the two tasks' held-out rows (the tokenizer of
    both tiny models has one token per character)."""
    addition, sorting = AdditionTask(), SortingTask()
    add_len = statistics.mean(
        len(addition.completion(*addition.operands(r["prompt"]))) for r in addition.heldout_rows()
    )
    sort_len = statistics.mean(len(r["answer"]) for r in sorting.heldout_rows())
    return [
        f"A right completion is {add_len:.1f} tokens on average before the end token, against {sort_len:.1f} for a "
        "sorting answer",
        f"Its held-out split of {len(addition.heldout_rows())} sums never appears in pretraining or in RL prompts",
    ]


def stage_stats(rows: pd.DataFrame) -> Dict[Tuple[str, float], Tuple[float, float, int]]:
    """(method, peak lr) → (mean, SD, seeds) of the held-out accuracy at the budget (each trial's last evaluation)."""
    last = rows.dropna(subset=["heldout"]).sort_values("iteration").groupby(["method", "lr_peak", "seed"]).last()
    out = {}
    for (method, lr), cell in last.groupby(level=["method", "lr_peak"]):
        values = cell["heldout"]
        out[method, float(lr)] = (float(values.mean()), float(values.std()), len(values))
    return out


def base_quote(rows: pd.DataFrame) -> Tuple[str, float]:
    """The base model's held-out accuracy: each trial's first evaluation, at iteration 1 before any update. Every trial
    of a seed samples it alike, so it is one value per seed (a ValueError if two trials of a seed disagree)."""
    first = rows[rows["iteration"] == 1].dropna(subset=["heldout"]).groupby("seed")["heldout"]
    if (first.max() != first.min()).any():
        raise ValueError(f"the base model's first evaluation differs between trials of a seed: {first.agg(list)}")
    per_seed = first.first()
    mean = float(per_seed.mean())
    seeds = words([f"{v:.3f}" for v in per_seed])
    return (
        f"The base model answers {mean:.3f} of the held-out sums right when it samples (each trial's first "
        f"evaluation, taken before any update, the same in every trial of a seed: {seeds} on seeds "
        f"{words([str(x) for x in per_seed.index])})",
        mean,
    )


def identical_groups(rows: pd.DataFrame) -> List[List[str]]:
    """Methods whose trials end at exactly the same held-out accuracy in every (peak, seed) both ran: on-policy with
    one optimizer step per batch their ratios are 1, so a clip, a cap or a mask changes nothing and the updates are
    one computation (bit for bit: the sweep runs them apart where their settings differ)."""
    last = rows.dropna(subset=["heldout"]).sort_values("iteration").groupby(["method", "lr_peak", "seed"])["heldout"]
    ends = last.last().unstack("method")
    groups: List[List[str]] = []
    for method in ends.columns:
        for group in groups:
            both = ends[[group[0], method]].dropna()
            if len(both) and (both[group[0]] == both[method]).all():
                group.append(method)
                break
        else:
            groups.append([method])
    return [g for g in groups if len(g) > 1]


def complete_cells(root: str, stage: str) -> Tuple[pd.DataFrame, Dict[Tuple[str, float], Tuple[float, float, int]]]:
    """An lr stage's trial rows and its cells (`stage_stats`) that have every lr seed run (a cell with fewer is left
    out: a partial mean would not compare)."""
    rows = trial_rows(root, stage)
    seeds = len(DEVELOPMENT.lr_seeds)
    return rows, ({k: v for k, v in stage_stats(rows).items() if v[2] == seeds} if len(rows) else {})


def best_cell_quote(
    stats: Dict[Tuple[str, float], Tuple[float, float, int]], done: bool, start: Optional[float] = None
) -> str:
    """The stage's best cell (from ``start``, the base model's accuracy, where given) and how many cells are best or
    tied; "so far" while the stage runs (``done`` False)."""
    top = max(stats, key=lambda k: stats[k][0])
    so_far = "" if done else " so far"
    since = f", from {start:.3f} at the start" if start is not None else ""
    return (
        f"The best cell{so_far} is `{top[0]}` at lr {top[1]:g}: {pm(*stats[top])} over {stats[top][2]} seeds{since}; "
        f"{_count(len(best_or_tied(stats)), 'cell is', 'cells are')} best or tied{so_far}"
    )


def stage_matrix(root: str, stage: str) -> List[str]:
    """An lr stage's matrix of method × peak over its complete cells (`complete_cells`), best or tied in bold (over
    every cell), then whether the stage has finished and its best cell; nothing before a cell is complete. While the
    stage runs its bracket may still grow, so the best cell is the best so far."""
    _, stats = complete_cells(root, stage)
    if not stats:
        return []
    done = stage in finished_stages(root)
    peaks = sorted({lr for _, lr in stats})
    methods = list(dict.fromkeys(m for m, _ in sorted(stats, key=lambda k: DEVELOPMENT.methods.index(k[0]))))
    best = best_or_tied(stats)

    def cell(method: str, lr: float) -> str:
        if (method, lr) not in stats:
            return "–"
        text = pm(*stats[method, lr])
        return f"**{text}**" if (method, lr) in best else text

    seeds = len(DEVELOPMENT.lr_seeds)
    return [
        "The stage has finished"
        if done
        else f"The stage is still running: {_count(len(stats), 'cell has', 'cells have')} all {seeds} seeds (a cell "
        "with fewer is left out, and the bracket may still grow where a method's best peak is at its end)",
        *table(
            ["method", *[f"lr {lr:g}" for lr in peaks]], [[f"`{m}`", *[cell(m, lr) for lr in peaks]] for m in methods]
        ),
        best_cell_quote(stats, done),
    ]


def _count(n: int, one: str, many: str) -> str:
    """``1 cell is``, ``3 cells are``."""
    return f"{n} {one if n == 1 else many}"


def on_policy_quotes(root: str) -> List[str]:
    """The on-policy lr stage (`stage_matrix`), the base model's accuracy, the methods that compute the same update
    there, and the headroom test. The headroom's "best at least" part can only be met sooner, never undone, by cells
    still to come."""
    stage = lr_stages()[0]
    matrix = stage_matrix(root, stage)
    if not matrix:
        return ["No cell of the on-policy learning-rate stage has all its seeds yet"]
    rows, stats = complete_cells(root, stage)
    top = max(stats, key=lambda k: stats[k][0])
    base, base_mean = base_quote(rows)
    default_trial = DEVELOPMENT.same_run_as("on_policy", DEFAULT_METHOD)
    holds = base_mean <= BASE_AT_MOST and stats[top][0] >= BEST_AT_LEAST
    return [
        matrix[0],
        base,
        *[q for q in matrix[1:] if q.startswith("|")],
        f"P3O's default (`{DEFAULT_METHOD}`) runs in the trials of `{default_trial}` on-policy",
        *[
            f"{words([f'`{m}`' for m in group])} end at exactly the same held-out accuracy in every trial they all ran "
            "(the same update on-policy, run apart)"
            for group in identical_groups(rows)
        ],
        best_cell_quote(stats, stage in finished_stages(root), base_mean),
        f"The task has the headroom the bench needs (the base model at most {BASE_AT_MOST:g} held-out, the best method "
        f"at least {BEST_AT_LEAST:g} on-policy within the budget): " + ("it does" if holds else "not so far"),
    ]


def other_stage_quotes(root: str, stage: str) -> List[str]:
    """An lr stage after on-policy (`stage_matrix`), with the trials P3O's default runs in there and its best peak
    so far against the stage's best cell; nothing before a cell is complete."""
    matrix = stage_matrix(root, stage)
    if not matrix:
        return []
    _, stats = complete_cells(root, stage)
    regime = stage_regime(stage)
    twin = DEVELOPMENT.same_run_as(regime, DEFAULT_METHOD)
    own = {lr: v for (m, lr), v in stats.items() if m == twin}
    out = [*matrix, f"P3O's default (`{DEFAULT_METHOD}`) runs in the trials of `{twin}` in `{regime}`"]
    if own:
        lr, cell = max(own.items(), key=lambda kv: kv[1][0])
        top = max(stats, key=lambda k: stats[k][0])
        diff, se, _ = effect({"top": stats[top], "own": cell}, "top", "own")
        out.append(
            f"Its best peak{'' if stage in finished_stages(root) else ' so far'} is {lr:g}: {pm(*cell)}, "
            f"{diff:+.3f} to the best cell (SE {se:.3f})"
        )
    return out


# Each lr stage's curves, one line per peak (P3O's default's trials): drawn into the set's figures, shown by the page
# from its copy beside it (`write_page`), as every results page shows its runs' figures.
def figure_name(stage: str) -> str:
    return f"{stage}.png"


def figure_path(stage: str) -> str:
    """Where the page shows a stage's figure, relative to the page."""
    return f"figures/{os.path.basename(BENCH_ADDITION_DEVELOPMENT)}/{figure_name(stage)}"


LR_FIGURE_NAME = figure_name(lr_stages()[0])
LR_FIGURE = figure_path(lr_stages()[0])


def default_rows(root: str, stage: str) -> pd.DataFrame:
    """The rows of the trials P3O's default runs in an lr stage (those of the method it shares them with), by peak;
    empty before any has finished."""
    rows = trial_rows(root, stage)
    if not len(rows):
        return rows
    twin = DEVELOPMENT.same_run_as(stage_regime(stage), DEFAULT_METHOD)
    return rows[rows[report.METHOD] == twin].sort_values(report.LR_PEAK)


def lr_figure(root: str, path: str, stage: Optional[str] = None) -> Optional[str]:
    """Held-out accuracy and ESS over the completions trained in an lr stage (the on-policy one by default), one
    line per peak, mean ± SD over the seeds, for the trials P3O's default runs in there (`report.plot_regime`); None
    before any of them has finished."""
    stage = stage or lr_stages()[0]
    rows = default_rows(root, stage)
    if not len(rows):
        return None
    rows = rows.assign(**{report.METHOD: [f"lr {lr:g}" for lr in rows[report.LR_PEAK]]})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    per_iteration = int(rows["completions_per_iteration"].iloc[0])
    return report.plot_regime(rows, stage, path, per_iteration, heldout_label="held-out accuracy (sampled)")


def progress_quote(root: str) -> str:
    """How much of the development set has run, from the sweep's report of its trial files."""
    report = load_json(root, f"{BENCH_ADDITION_DEVELOPMENT}/summary.json")
    done = finished_stages(root)
    said = words([f"`{s}`" for s in done]) if done else "none"
    return f"{report['note'] or 'The development set is complete.'} Learning-rate stages finished: {said}"


def confirmation_progress_quote(root: str) -> str:
    """How much of the confirmation set has run: not yet, partial (the sweep's note), or complete."""
    if not os.path.exists(os.path.join(root, BENCH_ADDITION_CONFIRMATION, "summary.json")):
        return "The confirmation set has not run yet"
    note = load_json(root, f"{BENCH_ADDITION_CONFIRMATION}/summary.json")["note"]
    return (
        f"The confirmation set is {note[0].lower() + note[1:].rstrip('.')}"
        if note
        else "The confirmation set is complete"
    )


def lr_choice_quotes(root: str) -> List[str]:
    """Each method's peak lr per family (`lr_quotes`) from the development set's ``lr_choice.json``, which the sweep
    writes once every lr stage has finished; nothing before."""
    if not os.path.exists(os.path.join(root, BENCH_ADDITION_DEVELOPMENT, "lr_choice.json")):
        return []
    return lr_quotes(root, BENCH_ADDITION_DEVELOPMENT, DEVELOPMENT.methods)


def set_quotes(root: str, folder: str, grid: SweepGrid, name: str) -> List[str]:
    """One set's regime × method matrix over its finished regimes (`finished`), then P3O's default's standing there
    (`aim_quotes`: best or tied, behind by how much, ahead of every peer's default, collapsed seeds); nothing while
    no regime has finished (the regime × task table and the progress sentences say how far it has run)."""
    g = load(root, folder, grid)
    done = finished(g, grid)
    if not done:
        return []
    running = [r for r in grid.regimes if r not in done]
    return [
        *matrix_quotes(g, done),
        *([f"Still running or to run: {words([f'`{r}`' for r in running])}"] if running else []),
        "; ".join(aim_quotes(g, name, len(grid.seeds), DEFAULT_METHOD, grid=grid)),
        f"The {name} set's files hold {distinct_trials(root, folder)} distinct trials",
    ]


def same_models_quote(root: str) -> str:
    """Whether the confirmation set started from the development set's base and weaker models: their weight files in
    the two sets' committed prep folders, compared byte for byte (`Grid.models_from`)."""
    folders = [os.path.join(root, f, "prep") for f in (BENCH_ADDITION_DEVELOPMENT, BENCH_ADDITION_CONFIRMATION)]
    if not all(os.path.isdir(os.path.join(f, m)) for f in folders for m in MODELS):
        return "Its prep folder is not committed with both models, so this page cannot say which models it started from"
    differ = [m for m in MODELS if not same_weights(*(os.path.join(f, m) for f in folders))]
    if differ:
        verb = "differs" if len(differ) == 1 else "differ"
        return f"It started from other models than the development set's: {words([f'`{m}`' for m in differ])} {verb}"
    return "It started from the development set's base and weaker models (the same weight files, byte for byte)"


def dropped_quote() -> str:
    """Which methods of the development set the confirmation set does not run, and why: candidates for P3O's weight
    on another model's tokens that the sorting task's last choice passed over (its confirmation set does not run them
    either). A ValueError if a method is left out for another reason (the page would have no words for it)."""
    dropped = [m for m in DEVELOPMENT.methods if m not in CONFIRMATION.methods]
    if not dropped:
        return "It runs every method of the development set"
    sorting = GRIDS["sorting", "confirmation"].methods
    unexplained = [m for m in dropped if m not in OTHER_MODEL_CANDIDATES or m in sorting]
    if unexplained:
        raise ValueError(f"the confirmation set leaves out {unexplained}, for no reason the page can give")
    what = "a candidate" if len(dropped) == 1 else "candidates"
    return (
        f"It runs every method of the development set but {words([f'`{m}`' for m in dropped])}: {what} for P3O's "
        "weight on another model's tokens that the sorting task's last choice passed over and its confirmation set "
        "does not run either"
    )


# The aim on the confirmation set: ahead of every peer's default by more than the SE in at least this many
# regimes where the data drift (every regime but on-policy).
AIM_AHEAD_AT_LEAST = 2


def aim_verdict_quotes(root: str) -> List[str]:
    """The aim on the complete confirmation set, met or not, then what the page has on each way it is missed: for
    each regime where P3O's default is behind or a seed of it collapsed, the regime's best method and both rates;
    where it is ahead of every peer's default in too few regimes where the data drift, for each such regime where it
    is not, the peer's default closest to it (the highest mean) and their difference; and the learner's diagnostics
    (`diagnostics_quotes`) of the default and the method it is set against in each. Nothing while the set is
    partial."""
    g = load(root, BENCH_ADDITION_CONFIRMATION, CONFIRMATION)
    if g is None or g.note or len(finished(g, CONFIRMATION)) < len(CONFIRMATION.regimes):
        return []
    regimes = list(g.regimes)
    held, missed, ahead, collapsed = standing(g, regimes, DEFAULT_METHOD)
    drift_regimes = [r for r in regimes if r != LR_FAMILY_REGIMES[ON_POLICY_FAMILY]]  # every regime but on-policy
    drift = [r for r in ahead if r in drift_regimes]
    met = not missed and len(drift) >= AIM_AHEAD_AT_LEAST and not collapsed
    seeds = sum(g.stats[r][DEFAULT_METHOD][2] for r in regimes)
    out = [
        f"The aim on the confirmation set (P3O's default best or tied in every regime, ahead of every peer's default "
        f"by more than the standard error in at least {AIM_AHEAD_AT_LEAST} regimes where the data drift, no collapsed "
        f"seed) is {'met' if met else 'not met'}: it is best or tied in {len(held)} of {len(regimes)} regimes, "
        f"ahead of every peer's default in {len(drift)} where the data drift"
        + (f" ({words([f'`{r}`' for r in drift])})" if drift else "")
        + f", and {collapsed} of its {seeds} seeds collapsed"
    ]
    pairs: List[Tuple[str, str]] = []
    for r in regimes:
        lost = g.collapses[r][DEFAULT_METHOD]
        if r not in missed and not lost:
            continue
        best = best_method(g, r)
        if r in missed:
            said = f"behind by {g.stats[r][best][0] - g.stats[r][DEFAULT_METHOD][0]:.3f}, the regime's best `{best}`"
            said += f"; the default trains at lr {_rate(g, DEFAULT_METHOD, r)}, `{best}` at {_rate(g, best, r)}"
        else:
            said = "best or tied" + (" (every method ties)" if all_tie(g.stats[r]) else "")
        out.append(f"`{r}`: {said}" + (f"; {lost} of its seeds collapsed" if lost else ""))
        pairs += [(r, DEFAULT_METHOD)] + ([(r, best)] if r in missed else [])
    if len(drift) < AIM_AHEAD_AT_LEAST:
        for r in [r for r in drift_regimes if r not in drift and r not in missed]:
            peers = [p for p in PEER_DEFAULTS if p in g.stats[r]]
            closest = max(peers, key=lambda p: g.stats[r][p][0])
            diff, se, _ = effect(g.stats[r], closest, DEFAULT_METHOD)
            out.append(
                f"`{r}`: not ahead of `{closest}` beyond the SE ({diff:+.3f}, SE {se:.3f}); the default trains at lr "
                f"{_rate(g, DEFAULT_METHOD, r)}, `{closest}` at {_rate(g, closest, r)}"
            )
            pairs += [(r, DEFAULT_METHOD), (r, closest)]
    return out + (diagnostics_quotes(g, list(dict.fromkeys(pairs)), CONFIRMATION) if pairs else [])


def addition_rate_quotes(root: str) -> List[str]:
    """The confirmation set's default at the learning rate of the regime's best method (`BENCH_ADDITION_RATE`), where
    it is behind and trains at another rate (`provenance.rate_quotes`): a diagnosis run after the set."""
    return rate_quotes(root, BENCH_ADDITION_RATE, BENCH_ADDITION_CONFIRMATION, CONFIRMATION)


def _rate(g: Grid, method: str, regime: str) -> str:
    """A method's peak learning rate in a regime, as the set's report gives it."""
    return f"{method_peak(g.report['lr_peak'], method, regime):g}"


# The sets the regime × task table puts side by side, left to right: (task, set, its folder, its sweep grid). The
# sorting task's is the confirmation set of data another model recorded (docs/results/provenance.md), whose default
# P3O's default is on both tasks.
TASK_SETS: Tuple[Tuple[str, str, str, SweepGrid], ...] = (
    ("sorting", "confirmation", BENCH_PROVENANCE_CONFIRMATION, GRIDS["sorting", "confirmation"]),
    ("addition", "development", BENCH_ADDITION_DEVELOPMENT, DEVELOPMENT),
    ("addition", "confirmation", BENCH_ADDITION_CONFIRMATION, CONFIRMATION),
)
NOT_IN_SET, NOT_RUN, RUNNING = "–", "not run yet", "running"


def seeds_words(grid: SweepGrid) -> str:
    """``seed 3``, ``seeds 3-5`` (a run of seeds) or ``seeds 0, 2 and 7``."""
    seeds = sorted(grid.seeds)
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + words([str(s) for s in seeds])


def finished(g: Optional[Grid], grid: SweepGrid) -> List[str]:
    """The regimes of a set that have finished: every method the grid runs there, every seed (none without files)."""
    return complete(g, len(grid.seeds), DEFAULT_METHOD, grid) if g is not None else []


HELD, BEHIND, NO_EVIDENCE = "held", "behind", "no evidence"


def standing_in(g: Grid, regime: str, default: str = DEFAULT_METHOD) -> Tuple[str, bool, int]:
    """P3O's default in one finished regime: `HELD` (best or tied), `BEHIND`, or `NO_EVIDENCE` (every method ties
    there, so it is best or tied whatever it does); whether it is ahead of every peer's default by more than the
    standard error; how many of its seeds collapsed."""
    held, _, ahead, collapsed = standing(g, [regime], default)
    if all_tie(g.stats[regime]):
        return NO_EVIDENCE, bool(ahead), collapsed
    return (HELD if held else BEHIND), bool(ahead), collapsed


def verdict_cell(g: Grid, regime: str, default: str = DEFAULT_METHOD) -> str:
    """A table cell of `standing_in`: best or tied, or behind (its mean's difference to the regime's highest mean, and
    that method), or every method tied; ahead of every peer's default (by more than the SE); collapsed seeds."""
    state, ahead, collapsed = standing_in(g, regime, default)
    if state == BEHIND:
        best = best_method(g, regime)
        text = f"behind ({g.stats[regime][default][0] - g.stats[regime][best][0]:+.3f} to `{best}`)"
    else:
        text = "best or tied" + (" (every method ties: no evidence)" if state == NO_EVIDENCE else "")
    if ahead:
        text += ", ahead of every peer's default"
    if collapsed:
        text += f", {collapsed} of {g.stats[regime][default][2]} seeds collapsed"
    return text


def regime_task_quotes(root: str, sets: Tuple[Tuple[str, str, str, SweepGrid], ...] = TASK_SETS) -> List[str]:
    """The regime × task table of P3O's default's verdicts, one column per set (`TASK_SETS`), a row per regime any of
    them runs: a regime a set has finished (`finished`) shows its verdict (`verdict_cell`); one it runs but has not
    finished, "running" (it has rows) or "not run yet"; one it does not run, "–". Then, per set, how many of its
    finished regimes hold (a regime where every method ties is not counted as held)."""
    loaded = [(task, name, load(root, folder, grid), grid) for task, name, folder, grid in sets]
    regimes = list(dict.fromkeys(r for *_, grid in loaded for r in grid.regimes))
    columns, counts = [], []
    for task, name, g, grid in loaded:
        done = finished(g, grid)
        column = {}
        for r in regimes:
            if r not in grid.regimes:
                column[r] = NOT_IN_SET
            elif r in done:
                column[r] = verdict_cell(g, r)
            else:
                column[r] = RUNNING if g is not None and r in g.regimes else NOT_RUN
        columns.append((f"{task}, {name} ({seeds_words(grid)})", column))
        if not done:
            counts.append(f"The {task} task's {name} set: no regime finished yet")
            continue
        states = {r: standing_in(g, r) for r in done}
        held = [r for r in done if states[r][0] == HELD]
        ties = [r for r in done if states[r][0] == NO_EVIDENCE]
        ahead = [r for r in done if states[r][1]]
        of = (
            f"{len(done)} finished regimes of {len(grid.regimes)}"
            if len(done) < len(grid.regimes)
            else (f"its {len(done)} regimes")
        )
        counts.append(
            # Counted as the page's other sentences count them (a regime where every method ties is "best or tied"),
            # those regimes said apart: they are no evidence.
            f"The {task} task's {name} set: best or tied in {len(held) + len(ties)} of {of}"
            + (f" (in {len(ties)} of them every method ties: no evidence)" if ties else "")
            + f"; ahead of every peer's default by more than the SE in {len(ahead)}"
        )
    rows = [[f"`{r}`", *[column[r] for _, column in columns]] for r in regimes]
    return [*table(["regime", *[title for title, _ in columns]], rows), *counts]


def readme_development(root: str) -> Optional[str]:
    """README's clause on the addition task's complete development set (`aim_quotes` over its regimes, the rates it
    chose named), and, while its confirmation set is not complete, that it is under way; None while the development
    set is partial. Once the confirmation set is complete, README carries `readme_both_tasks` too."""
    g = load(root, BENCH_ADDITION_DEVELOPMENT, DEVELOPMENT)
    if g is None or g.note or len(finished(g, DEVELOPMENT)) < len(DEVELOPMENT.regimes):
        return None
    aim = aim_quotes(g, "development", len(DEVELOPMENT.seeds), DEFAULT_METHOD, grid=DEVELOPMENT)
    said = "; ".join(aim[:-1]).replace("On the development set ", "", 1)
    confirmation = load(root, BENCH_ADDITION_CONFIRMATION, CONFIRMATION)
    done = confirmation is not None and not confirmation.note
    return f"on its development set ({seeds_words(DEVELOPMENT)}, which chose the learning rates) {said}" + (
        "" if done else f"; its confirmation set ({seeds_words(CONFIRMATION)}) is under way"
    )


def readme_both_tasks(root: str, sets: Tuple[Tuple[str, str, str, SweepGrid], ...] = TASK_SETS) -> Optional[str]:
    """README's sentence on what holds on both tasks and what on one, over the regimes both tasks' confirmation sets
    run (the two sets named "confirmation" in ``sets``; None until both are complete). A regime where every method
    ties on either task is evidence of nothing there and is named apart."""
    confirmations = [(task, folder, grid) for task, name, folder, grid in sets if name == "confirmation"]
    if len(confirmations) != 2:
        raise ValueError(f"two confirmation sets to compare, got {len(confirmations)}")
    states = {}
    for task, folder, grid in confirmations:
        g = load(root, folder, grid)
        if g is None or g.note or len(finished(g, grid)) < len(grid.regimes):
            return None
        states[task] = (g, {r: standing_in(g, r) for r in g.regimes})
    (first, (a, in_a)), (second, (b, in_b)) = states.items()
    shared = [r for r in a.regimes if r in b.regimes]

    def said(keep) -> str:
        regimes = [r for r in shared if keep(in_a[r][0], in_b[r][0])]
        return words([f"`{r}`" for r in regimes]) if regimes else "none"

    ahead = [r for r in shared if in_a[r][1] and in_b[r][1]]
    return (
        f"on both tasks' confirmation sets ({first} and {second}, {len(shared)} regimes both run) P3O's default is "
        f"best or tied on both in {said(lambda x, y: x == y == HELD)}, on {first} only in "
        f"{said(lambda x, y: x == HELD and y == BEHIND)}, on {second} only in "
        f"{said(lambda x, y: x == BEHIND and y == HELD)}, behind on both in {said(lambda x, y: x == y == BEHIND)}; "
        f"every method ties on one task or both in {said(lambda x, y: NO_EVIDENCE in (x, y))}; ahead of every "
        f"peer's default by more than the standard error on both in "
        f"{words([f'`{r}`' for r in ahead]) if ahead else 'none'}"
    )


def quotes(root: str) -> List[str]:
    return [
        *task_quotes(),
        *on_policy_quotes(root),
        *[q for stage in lr_stages()[1:] for q in other_stage_quotes(root, stage)],
        *lr_choice_quotes(root),
        *set_quotes(root, BENCH_ADDITION_DEVELOPMENT, DEVELOPMENT, "development"),
        *(said := set_quotes(root, BENCH_ADDITION_CONFIRMATION, CONFIRMATION, "confirmation")),
        *([same_models_quote(root), dropped_quote()] if said else []),
        *aim_verdict_quotes(root),
        *addition_rate_quotes(root),
        *regime_task_quotes(root),
        *([both[0].upper() + both[1:]] if (both := readme_both_tasks(root)) else []),  # as the page's sentence starts
        progress_quote(root),
        confirmation_progress_quote(root),
        TIE_RULE,
        COLLAPSE_RULE,
        machine_words(cpus(root)),
    ]


def cpus(root: str) -> List[str]:
    """The CPUs the development set's trials ran on (`trial_cpus`)."""
    return trial_cpus(report.read_trials(os.path.join(root, BENCH_ADDITION_DEVELOPMENT)))


def header(root: str) -> str:
    """The page's title and its "How this is measured" box, with the CPUs the set's trials ran on."""
    return HEADER_TOP + info_box_tail("addition", cpus(root)) + HEADER_BOTTOM


HEADER_TOP = """# A second task: addition with the carries written out

!!! info "How this is measured"
    - **Commands:** `rllib-p3o sweep --task addition --development --parallel 2 --out runs/bench-addition-development`
      (the development set), then, after its learning-rate choice was committed,
      `rllib-p3o sweep --task addition --confirmation --parallel 2 --out runs/bench-addition-confirmation` (the
      confirmation set), each in a fresh clone; their files are in `results/bench-addition-development/` and
      `results/bench-addition-confirmation/` ([the sweep guide](../guide/sweep.md) gives every command).
"""
HEADER_BOTTOM = """
Every claim on the [claims bench](claims.md), [under staleness](staleness.md) and on
[data another model recorded](provenance.md) is measured on one task, sorting digits. This page runs the same
protocol on a task of another kind, so that a property of P3O can be told from a property of sorting: a development
set that chooses each method's learning rate per family of regimes by the same rule, then a confirmation set on
other seeds run after that choice is committed.
"""

TASK_INTRO = """## The task and how it differs

A prompt asks for the sum of two three-digit numbers, `add:347+586=`; a right completion adds them column by column
from the units, writing each column's carry, then the sum: `7+6=13,4+8+1=13,3+5+1=9:933`
(`rllib_p3o/tasks/addition.py`). It differs from sorting in three ways:

- **The answer is computed, not rearranged.** A slip in one column's carry changes every digit after it.
- **A sparse reward on the last tokens.** Only the number after `:` is checked, exactly: a right sum from a wrong
  trace counts, a right trace with a miscopied sum does not.
- **Longer completions.** Ratios and their mismatch accumulate over more tokens per completion.
"""

TASK_OUTRO = """The base model is a tiny Qwen2 pretrained like the sorting task's: on every training pair's column sums, and on the
task's format where most lines carry one slip (a carry dropped, or a column one off) and their sum follows from it,
so it adds sloppily and RL has to make the carries right.
"""

HEADROOM_INTRO = """## Headroom: the on-policy learning-rate stage

The development set starts with each method's learning-rate bracket on-policy, on seeds 0-1, every trial for the
bench's budget (the chosen peak then runs on seed 2 as well). Methods whose settings differ only where data are
off-policy share one trial (named for the first of them). Each cell: held-out accuracy at the budget, mean ± SD over
the seeds (SD: the sample standard deviation), best or tied in bold (over every cell).
"""

VERDICTS_INTRO = f"""## Regime × task: P3O's default on both tasks

Each cell: P3O's default (`{DEFAULT_METHOD}`) in one regime of one set, every method at its own learning rate by
the same rule on both tasks: best or tied, or behind (the difference of its mean to the regime's highest mean, and
that method); "ahead of every peer's default" where it beats each peer's default loss by more than the standard
error of the difference; its collapsed seeds. A regime where every method ties says nothing of P3O and is marked so. A set's cell is filled once the regime has finished there (every
method, every seed); "–": the set does not run that regime. The sorting task's column is the confirmation set of
[data another model recorded](provenance.md). Development and confirmation sets are reported apart: the development
set chose the learning rates.
"""

LR_CHOICE_INTRO = """## Learning rates: each method's own, per family of regimes

The development set's learning-rate stages, one per family of regimes (on-policy; the policy's own stale data,
`async_staleness_4`; another model's data, `offline_weaker`), each method's bracket on seeds 0-1, extended while its
best is at an end. Each method then trains at its best peak in every regime of that family, on both sets (the
sorting bench's rule). Every method runs at its own rate, chosen on this task.
"""

DEVELOPMENT_INTRO = """## The development set

Every method at its own rate in each family's regime and with a live weaker second model (`behavior_weaker`), on
seeds 0-2: in a family's regime the lr stage's trials at the chosen peak are seeds 0-1 and seed 2 runs after the
choice; `behavior_weaker` runs all three after it. The set chose the rates, nothing else: P3O's default is the one
the sorting task's rounds chose.
"""

CONFIRMATION_INTRO = """## The confirmation set

The task's regimes (the sorting bench's, and calls in flight with in-flight weight updates) on seeds 3-5, run after
the development set's choice was committed, every method at its committed rate.
"""

AIM_INTRO = """## The aim, and where it is missed
"""

RATE_INTRO = """## Where the default is behind: its learning rate

Where P3O's default is behind under staleness and with several steps per batch, it trains at twice the rate of the
regime's best method (its async family's rate, chosen in `async_staleness_4` on the development set). The same update
ran again on the same seeds at the best method's rate in the regime where it is furthest behind under staleness and
in the one where a seed collapsed at four steps per batch:
`rllib-p3o sweep --task addition --confirmation --regimes async_staleness_8 four_steps_per_batch --methods p3o_other_alone --lr 0.000125 --parallel 2 --out runs/bench-addition-confirmation-rate`
(its files are in `results/bench-addition-confirmation-rate/`). It is a diagnosis run after the confirmation set,
chosen by looking at it, not a choice: no rate or default was changed by it.
"""

STATUS_INTRO = """## What has run, and what follows

The development set runs the learning-rate stages of the three families (on-policy, the policy's own stale data,
another model's data), then its regimes on the last seed and with a live weaker second model. Its choice is
committed before the confirmation set runs.
"""


OTHER_STAGES_INTRO = """## The other learning-rate stages

The same bracket in the regime of each other family, on seeds 0-1, every method and peak a trial for the bench's
budget, extended while a method's best peak is at an end (cells as on-policy, best or tied in bold over the stage).
Each figure shows the trials P3O's default runs in there, one line per peak, as on-policy.
"""


LR_FIGURE_TEXT = f"""![The on-policy learning-rate stage: held-out accuracy and ESS per peak]({LR_FIGURE})

The stage's curves at each peak, for the trials P3O's default runs in on-policy: held-out accuracy (sampled, as the
evaluation does) and the training batch's ESS against the completions trained, mean ± SD over the seeds
(`python -m results_check.pages.addition` draws it from the trial files, with this page).
"""


def page_text(root: str) -> str:
    task = task_quotes()
    on_policy = on_policy_quotes(root)
    table_lines = [q for q in on_policy if q.startswith("|")]
    said = [q for q in on_policy if not q.startswith("|")]
    parts = [header(root), TASK_INTRO, task[0] + ".\n", TASK_OUTRO + task[1] + ".\n", HEADROOM_INTRO]
    if table_lines:
        parts += [" ".join(q + "." for q in said[:2]) + "\n", "\n".join(table_lines) + "\n"]
        parts += [LR_FIGURE_TEXT]
        parts += [q + ".\n" for q in said[2:]]
    else:
        parts += [q + ".\n" for q in said]
    parts += [TIE_RULE + " " + COLLAPSE_RULE + "\n"]
    others = [(stage, said) for stage in lr_stages()[1:] if (said := other_stage_quotes(root, stage))]
    if others:
        parts += [OTHER_STAGES_INTRO]
    for stage, said in others:
        regime = stage_regime(stage)
        parts += [
            f"### {FAMILY_NAMES[lr_family(regime)][0].upper() + FAMILY_NAMES[lr_family(regime)][1:]}: `{regime}`\n"
        ]
        parts += [said[0] + ".\n", _table(said), *_sentences(said[1:])]
        if len(default_rows(root, stage)):  # drawn once a trial of P3O's default there has finished (`write_page`)
            parts += [f"![The `{stage}` stage: held-out accuracy and ESS per peak]({figure_path(stage)})\n"]
    if lr := lr_choice_quotes(root):
        parts += [LR_CHOICE_INTRO, _table(lr), *_sentences(lr)]
    for intro, folder, grid, name in (
        (DEVELOPMENT_INTRO, BENCH_ADDITION_DEVELOPMENT, DEVELOPMENT, "development"),
        (CONFIRMATION_INTRO, BENCH_ADDITION_CONFIRMATION, CONFIRMATION, "confirmation"),
    ):
        said = set_quotes(root, folder, grid, name)
        own = [same_models_quote(root), dropped_quote()]
        if said:
            parts += [
                intro + "".join(f"{q}. " for q in (own if grid is CONFIRMATION else [])).rstrip() + "\n",
                CELL_LABEL + ".\n",
                _table(said),
                *_sentences(said),
            ]
    if aim := aim_verdict_quotes(root):
        behind = [q for q in aim[1:] if not q.startswith("|")]
        parts += [AIM_INTRO, aim[0] + ".\n"]
        if behind:
            parts += ["Where it is behind or a seed collapsed, and the learner's diagnostics there (mean over trials "
                      "and iterations):\n", "\n".join(f"- {q}." for q in behind) + "\n", _table(aim)]  # fmt: skip
    if rate := addition_rate_quotes(root):
        parts += [RATE_INTRO, *_sentences(rate)]
    verdicts = regime_task_quotes(root)
    parts += [VERDICTS_INTRO, _table(verdicts), *_sentences(verdicts)]
    both = readme_both_tasks(root)
    parts += [both[0].upper() + both[1:] + ".\n"] if both else []
    development_partial = load_json(root, f"{BENCH_ADDITION_DEVELOPMENT}/summary.json")["note"]
    parts += [
        STATUS_INTRO if development_partial else "## What has run\n",
        progress_quote(root) + ".\n",
        confirmation_progress_quote(root) + ".\n",
    ]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def _table(quotes: List[str]) -> str:
    """The table rows among ``quotes``, as one block."""
    return "\n".join(q for q in quotes if q.startswith("|")) + "\n"


def _sentences(quotes: List[str]) -> List[str]:
    """The sentences among ``quotes``, one paragraph each."""
    return [q + ".\n" for q in quotes if not q.startswith("|")]


def write_page(root: str) -> None:
    """The page, and each lr stage's figure (`lr_figure`, copied beside the page) once the page shows it."""
    for stage in lr_stages():
        if stage != lr_stages()[0] and not other_stage_quotes(root, stage):
            continue
        drawn = lr_figure(
            root, os.path.join(root, BENCH_ADDITION_DEVELOPMENT, report.FIGURES, figure_name(stage)), stage
        )
        if drawn:
            copy = os.path.join(root, os.path.dirname(PAGE.path), figure_path(stage))
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            shutil.copyfile(drawn, copy)
    with open(os.path.join(root, PAGE.path), "w") as f:
        f.write(page_text(root))


PAGE = Page(
    path="docs/results/addition.md",
    quotes=quotes,
    settings=("seeds 0-1", "seed 2", "seeds 0-2", "seeds 3-5"),
)


if __name__ == "__main__":  # python -m results_check.pages.addition: after committing the set's files
    write_page(".")
