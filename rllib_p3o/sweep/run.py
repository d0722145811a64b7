"""``rllib-p3o sweep``: the paper's comparisons on a built-in task as Ray Tune experiments, resumable.

    rllib-p3o sweep [--task arithmetic|sorting] [--quick | --full] [--out runs/sweep] [--fresh] [--parallel N]
                    [--regimes ...] [--methods ...] [--seeds ...] [--iterations N] [--lr PEAK] [--report-only]

Stages, each one Tune experiment under ``<out>``: first the lr stages ``lr_<regime>`` (each candidate peak lr ×
method × seed in each of the grid's lr regimes; skipped with ``--lr``), which choose one peak for every method
(the demo's grid: the peak whose worse method does best) or each method's best peak (the claims bench), then one
stage per regime (methods × seeds, `rllib_p3o.sweep.grid`). Within a stage, trials reuse Tune actors
(``reuse_actors=True``; `P3O.reset_config` keeps the vLLM runner and rebuilds the learner), so only the first
trial of each of the stage's ``--parallel`` slots pays the start-up.

Resume: every trial's rows are written to ``<out>/trials/<stage>/`` when it ends. A rerun with the same ``--out``
(after an interruption, in another session, or on a copy of ``<out>/trials``) runs only the trials without a file;
an interrupted trial starts over. Ctrl-C (or SIGUSR1) stops the sweep with exit status 130 after Tune has stopped
the running trial; it never goes on to the next stage with part of a stage. ``--fresh`` starts over.

Writes ``curves.csv`` (every trial's evaluations), ``summary.md``/``summary.json`` and one figure per regime
(`rllib_p3o.sweep.report`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import pandas as pd
from ray import tune

from rllib_p3o.core import storage
from rllib_p3o.sweep import failures, report
from rllib_p3o.sweep.grid import (
    CELL,
    GRIDS,
    LR_FAMILY_REGIMES,
    METHOD,
    METHOD_KEYS,
    METHODS,
    REGIMES,
    ROUNDS,
    TASKS,
    Grid,
    Prepared,
    cell_value,
    family_key,
    lr_schedule,
    method_peak,
    method_value,
    regime_config,
    repository_path,
    seed_inputs,
)

LR_CHOICE = "lr_choice.json"


class SweepInterrupted(Exception):
    """A stage ended with trials unfinished (Ctrl-C, SIGUSR1, or Tune stopping them): the sweep must stop there,
    not choose an lr or go on to the next stage from part of the data. Its finished trials are saved."""

    def __init__(self, stage: str, missing: List[tuple], total: int):
        self.stage, self.missing, self.total = stage, missing, total
        super().__init__(
            f"[{stage}] interrupted: {total - len(missing)} of {total} trials finished and saved, "
            f"{len(missing)} not (first: {_cell_name(missing[0])}); "
            "rerun the same command to continue"
        )


class StageProgress(tune.Callback):
    """Keeps every trial's rows and writes them when the trial ends (`report.write_trial`: what makes the sweep
    resumable), and prints one line per finished trial with the stage's progress and an ETA. A trial that ends
    before ``iterations`` without an error (stopped, not finished) is not written: a rerun runs it again."""

    def __init__(
        self, out: str, stage: str, num_trials: int, samples_per_iteration: int, iterations: int, attempt: int = 0
    ):
        self.out, self.stage, self.num_trials = out, stage, num_trials
        self.samples_per_iteration, self.iterations, self.attempt = samples_per_iteration, iterations, attempt
        self.infra_failed: List[tuple] = []  # cells whose trial an infrastructure failure ended (`failures`)
        self.setup()

    def setup(self, **info) -> None:  # (also called by Tune when an experiment starts)
        self.t0, self.finished_here = time.time(), 0
        self.rows: Dict[str, List[Dict]] = {}  # trial id -> its rows so far

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.setdefault(trial.trial_id, []).append(report.result_row(result))

    def _end(self, trials, trial, error: bool) -> None:
        rows = self.rows.pop(trial.trial_id, [])
        if not error and len(rows) < self.iterations:
            print(
                f"[{self.stage}] {_trial_name(trial)}: stopped after {len(rows)} of {self.iterations} iterations, "
                "not kept (a rerun runs it again)",
                flush=True,
            )
            return
        path = report.trial_path(self.out, self.stage, _trial_name(trial))
        report.write_trial(path, self.stage, _cell(trial.config), rows, error, self.samples_per_iteration)
        self.finished_here += 1
        left = self.num_trials - self.finished_here
        eta = (time.time() - self.t0) / self.finished_here * left
        heldout = [r[report.HELDOUT] for r in rows if r[report.HELDOUT] == r[report.HELDOUT]]
        text = (
            f"ERROR (see {trial.local_path}/error.txt)"
            if error
            else f"{len(rows)} it, held-out {heldout[-1] if heldout else float('nan'):.3f} at the last eval, "
            f"{(trial.last_result or {}).get('time_total_s', 0):.0f} s"
        )
        print(f"[{self.stage}] {_trial_name(trial)}: {text}; {left} trials left, ~{eta / 60:.1f} min", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trials, trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = _trial_error(trial)
        if failures.is_infrastructure_failure(error):
            # Not the method's failure: no trial file (so it is not a collapse), recorded apart, run again.
            self.rows.pop(trial.trial_id, None)
            self.infra_failed.append(_cell(trial.config))
            failures.record(self.out, self.stage, _trial_name(trial), error, self.attempt)
            print(
                f"[{self.stage}] {_trial_name(trial)}: infrastructure failure ({failures.summary_line(error, 160)}); "
                "not counted as the method's, run again",
                flush=True,
            )
            return
        self._end(trials, trial, error=True)


def _trial_error(trial) -> object:
    """The exception a failed trial raised, as Tune wrote it into the trial's local folder just before calling
    ``on_trial_error`` (the storage copy is synced later), or its text when Tune kept only that."""
    import cloudpickle

    try:
        if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
            with open(trial.pickled_error_file, "rb") as f:
                return cloudpickle.load(f)
        if trial.error_file and os.path.exists(trial.error_file):
            with open(trial.error_file) as f:
                return f.read()
    except Exception:  # an unreadable error file: classify nothing as infrastructure
        return None
    return None


def _cell_name(cell: tuple) -> str:
    """A (method, seed, lr peak) cell as its trial's name."""
    return "{}_seed{}_lr{:g}".format(*cell)


def _trial_name(trial) -> str:
    return _cell_name(_cell(trial.config))


def stage_parallelism(config, parallel: int) -> Tuple[int, Optional[int]]:
    """How many trials of a stage run at once, and the torch/OpenMP threads each of their learners and runners gets.

    A sync trial alternates generating and training, each phase on every core, so it keeps about one of two cores
    busy; ``parallel`` trials share the cores (``cores // parallel`` threads each: more threads than cores spin-wait
    on each other). An async trial runs its learner and runner side by side on a core each already: one at a time.
    ``None`` threads: the config's own budget (`P3OConfig.learner_threads`)."""
    if parallel <= 1 or config.async_sampling:
        return 1, None
    return parallel, max(1, (os.cpu_count() or 1) // parallel)


def run_stage(
    out: str,
    stage: str,
    config,
    cells: List[tuple],
    iterations: int,
    say=print,
    parallel: int = 1,
    overrides: Optional[Dict[str, Any]] = None,
) -> pd.DataFrame:
    """Run the trials of ``cells`` ((method, seed, lr peak) each) that have not finished yet as one Tune experiment
    ``<out>/<stage>``, ``parallel`` at a time (`stage_parallelism`), each running trial's actor reused by the next;
    returns the rows of every finished trial of the cells. ``overrides``: config keys each trial sets beyond its
    method's (`trial_overrides`).

    Resume: a finished trial's rows are in ``<out>/trials/<stage>/`` (written when it ended), so a rerun, in this
    or another process, on this machine or from a copy of that folder, runs only the cells without them."""
    cells = sorted(set(cells))
    done = report.read_trials(out, stage)
    finished = set() if done.empty else {(m, int(s), float(lr)) for m, s, lr in _trial_cells(done)}
    todo = [c for c in cells if c not in finished]
    if not todo:
        say(f"[{stage}] finished earlier: {len(cells)} trials, not run again")
    else:
        if finished & set(cells):
            say(f"[{stage}] continuing: {len(cells) - len(todo)} of {len(cells)} trials finished earlier are kept")
        concurrent, threads = stage_parallelism(config, parallel)
        if threads:
            config = config.copy(copy_frozen=False).training(
                num_threads_per_learner=threads, num_threads_per_env_runner=threads
            )
        say(
            f"[{stage}] {len(todo)} trials × {iterations} iterations"
            + (
                f", {concurrent} at a time ({threads} thread{'s' if threads > 1 else ''} each)"
                if concurrent > 1
                else ""
            )
        )
        for attempt in range(failures.MAX_INFRA_RETRIES + 1):
            progress = StageProgress(out, stage, len(todo), config.train_batch_rows, iterations, attempt)
            _fit_stage(out, stage, config, todo, concurrent, progress, overrides)
            todo = sorted(set(progress.infra_failed))
            if not todo:
                break
            if attempt < failures.MAX_INFRA_RETRIES:
                say(
                    f"[{stage}] {len(todo)} trial(s) lost to infrastructure failures: running them again "
                    f"(retry {attempt + 1} of {failures.MAX_INFRA_RETRIES}; {failures.INFRA_FAILURES} lists them)"
                )
    rows = saved_rows(out, stage, cells)
    saved = set(_trial_cells(rows)) if len(rows) else set()
    missing = [c for c in cells if c not in saved]
    if missing:
        raise SweepInterrupted(stage, missing, len(cells))
    return rows


def _fit_stage(
    out: str,
    stage: str,
    config,
    cells: List[tuple],
    concurrent: int,
    progress: StageProgress,
    overrides: Optional[Dict[str, Any]] = None,
) -> None:
    """One Tune experiment ``<out>/<stage>`` over ``cells``, its trials' files written by ``progress``."""
    path = os.path.join(out, stage)
    if os.path.isdir(path):
        shutil.rmtree(path)  # an interrupted experiment's Tune files: its finished trials are saved under trials/
    tune.Tuner(
        "P3O",
        param_space=stage_space(config, cells, overrides),
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            max_concurrent_trials=concurrent,
            trial_dirname_creator=_trial_name,
            trial_name_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            name=stage,
            storage_path=out,
            verbose=0,
            callbacks=[progress],
            stop={"training_iteration": progress.iterations},
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    ).fit()


def saved_rows(out: str, stage: str, cells: List[tuple]) -> pd.DataFrame:
    """The rows of the trials of ``cells`` whose files are saved under ``<out>/trials/<stage>/`` (finished ones)."""
    rows = report.read_trials(out, stage)
    if not len(rows):
        return rows
    wanted = set(cells)
    return rows[[c in wanted for c in _trial_cells(rows)]]


def _trial_cells(rows: pd.DataFrame) -> List[tuple]:
    return [(m, int(s), float(lr)) for m, s, lr in zip(rows[report.METHOD], rows[report.SEED], rows[report.LR_PEAK])]


def _cell(config: Dict) -> tuple:
    """A trial's (method, seed, lr peak), from its grid-searched cell (resolved when the trial is created; the
    values derived from it by ``tune.sample_from`` are placeholders until the trial starts)."""
    method, seed, lr = config[CELL]
    return method, int(seed), float(lr)


def seed_input(inputs: Dict[int, Any], spec: Any) -> Any:
    """``tune.sample_from`` function: the offline input of the trial's seed (`rllib_p3o.sweep.grid.seed_inputs`)."""
    return inputs[int(spec.config[CELL][1])]


def trial_overrides(grid: Grid, regime: str, prepared: Prepared) -> Dict[str, Any]:
    """Config keys a stage's trials set beyond their methods': the grid's own defaults for what a method does not
    name (`Grid.method_defaults`: a round's as it was measured), and each seed's offline input where the grid gives
    every seed its own recording (`rllib_p3o.sweep.grid.seed_inputs`)."""
    overrides: Dict[str, Any] = {
        key: tune.sample_from(functools.partial(method_value, key, grid.method_defaults))
        for key in grid.method_defaults
    }
    inputs = seed_inputs(REGIMES[regime], prepared, grid)
    if inputs:
        overrides["input_"] = tune.sample_from(functools.partial(seed_input, inputs))
    return overrides


def stage_space(config, cells: List[tuple], overrides: Optional[Dict[str, Any]] = None) -> Dict:
    """Tune's param space: the regime's config as a dict, a grid over the (method, seed, lr peak) cells, each trial's
    method's settings, seed and lr, and ``overrides`` (`trial_overrides`)."""
    space = config.to_dict()
    space[CELL] = tune.grid_search([list(c) for c in cells])
    space[METHOD] = tune.sample_from(functools.partial(cell_value, 0))
    for key in METHOD_KEYS:
        space[key] = tune.sample_from(functools.partial(method_value, key, {}))
    space["seed"] = tune.sample_from(functools.partial(cell_value, 1))
    space["lr"] = tune.sample_from(lambda spec: lr_schedule(spec.config[CELL][2]))
    space.update(overrides or {})
    return space


def lr_stage_name(regime: str) -> str:
    return report.LR_STAGE_PREFIX + regime


# How many times the lr stage may double its top peak while a method's best is the top one (`Grid.lr_extend`).
MAX_LR_EXTENSIONS = 3


def lr_groups(grid: Grid) -> Dict[Optional[str], Tuple[str, ...]]:
    """The lr regimes each choice is made over: one per lr family (`Grid.lr_per_family`: ``{family: (its regime,)}``,
    for the families whose regime is among the grid's lr regimes), else ``{None: grid.lr_regimes}``."""
    if not grid.lr_per_family:
        return {None: tuple(grid.lr_regimes)}
    return {f: (r,) for f, r in LR_FAMILY_REGIMES.items() if r in grid.lr_regimes}


def choose_lr(
    out: str, grid: Grid, prepared: Prepared, say=print, parallel: int = 1
) -> Tuple[Union[float, Dict[str, float]], pd.DataFrame]:
    """The lr stage (or the given lr, or another grid's choice): each method's best peak (``lr_per_method``; per lr
    family with ``lr_per_family``, keyed ``method@family``), or the peak whose worse method does best; with the lr
    stage's rows. With ``lr_extend`` the bracket grows upward (the top peak doubled, for the methods whose best it
    is) until every method's best peak is inside it; with ``lr_per_family`` downward too (the bottom peak halved)."""
    if grid.lr_choice_from:
        path = repository_path(grid.lr_choice_from)
        say(f"[lr] peak lr per method from {path}")
        return json.load(open(path))["lr_peak"], pd.DataFrame()
    if not grid.lr_peaks:
        return grid.default_lr, pd.DataFrame()
    lr_peak: Dict[str, float] = {}
    everything: Dict[str, Any] = {"families": {}}
    all_curves = []
    for family, regimes in lr_groups(grid).items():
        peaks, curves, choice = _lr_bracket(out, grid, prepared, regimes, say, parallel)
        all_curves.append(curves)
        chosen = _with_shared_runs(choice["lr_peak"], grid, regimes[0])
        if family is None:
            everything.update(choice, lr_peak=chosen, peaks=peaks)
            lr_peak = chosen
            continue
        lr_peak.update({family_key(m, family): p for m, p in chosen.items()})
        everything["families"][family] = {"regime": regimes[0], "peaks": peaks, "scores": choice.get("scores", {})}
        everything["why"] = choice["why"].replace("over the lr stage's regimes", "in each lr family's regime")
    if grid.lr_per_family:
        everything["lr_peak"] = lr_peak
    else:
        everything.pop("families")
    with open(os.path.join(out, LR_CHOICE), "w") as f:
        json.dump(everything, f, indent=2)
    say(f"[lr] chosen peak lr {everything['lr_peak']} ({everything['why']})")
    return everything["lr_peak"], report.concat(all_curves)


def _lr_bracket(
    out: str, grid: Grid, prepared: Prepared, regimes: Tuple[str, ...], say, parallel: int
) -> Tuple[List[float], pd.DataFrame, Dict]:
    """The lr stage in ``regimes`` over the grid's peaks, extended while a method's best is at an end of the bracket
    (`choose_lr`): the peaks tried, the stage's rows and the choice."""
    peaks = [float(p) for p in grid.lr_peaks]

    def stage(cells_at: List[float], methods: Tuple[str, ...]) -> pd.DataFrame:
        return report.concat(
            [
                run_stage(
                    out,
                    lr_stage_name(r),
                    regime_config(REGIMES[r], prepared, grid),
                    lr_cells(grid, r, cells_at, methods),
                    grid.iterations,
                    say,
                    parallel,
                    overrides=trial_overrides(grid, r, prepared),
                )
                for r in regimes
            ]
        )

    curves = stage(peaks, grid.lr_methods)
    choice = lr_choice(curves, grid, peaks)
    where = ", ".join(regimes)
    for _ in range(MAX_LR_EXTENSIONS if grid.lr_extend and grid.lr_per_method else 0):
        at_top = tuple(m for m, p in choice["lr_peak"].items() if np.isclose(p, peaks[-1]))
        at_bottom = tuple(m for m in choice["lr_peak"] if _best_at_bottom(choice, m, peaks)) * grid.lr_per_family
        if not at_top and not at_bottom:
            break
        if at_top:
            peaks.append(2 * peaks[-1])
            say(f"[lr] {where}: best peak at the top of the bracket for {', '.join(at_top)}: adding {peaks[-1]:g}")
            curves = report.concat([curves, stage(peaks[-1:], at_top)])
        if at_bottom:
            peaks.insert(0, peaks[0] / 2)
            say(f"[lr] {where}: best peak at the bottom of the bracket for {', '.join(at_bottom)}: adding {peaks[0]:g}")
            curves = report.concat([curves, stage(peaks[:1], at_bottom)])
        choice = lr_choice(curves, grid, peaks)
    return peaks, curves, choice


def _best_at_bottom(choice: Dict, method: str, peaks: List[float]) -> bool:
    """Whether ``method``'s best peak is the bracket's lowest and better than the next one: a tie there (a method that
    learns nothing at any peak, where ties go to the smaller peak) is no reason to try a lower one."""
    scores = choice.get("scores", {}).get(method, {})
    low, next_up = scores.get(f"{peaks[0]:g}"), scores.get(f"{peaks[1]:g}") if len(peaks) > 1 else None
    return np.isclose(choice["lr_peak"][method], peaks[0]) and low is not None and (next_up is None or low > next_up)


def _with_shared_runs(
    lr_peak: Union[float, Dict[str, float]], grid: Grid, regime: Optional[str] = None
) -> Union[float, Dict[str, float]]:
    """Every lr method's peak, a method that shares another's trials in the lr regime (``regime``, by default the
    grid's first; `Grid.same_run_as`) at that method's."""
    if not isinstance(lr_peak, dict):
        return lr_peak
    regime = regime or grid.lr_regimes[0]
    return {
        m: lr_peak[grid.same_run_as(regime, m, grid.lr_methods)]
        for m in grid.lr_methods
        if grid.same_run_as(regime, m, grid.lr_methods) in lr_peak
    }


def lr_cells(
    grid: Grid,
    regime: Optional[str] = None,
    peaks: Optional[List[float]] = None,
    methods: Optional[Tuple[str, ...]] = None,
) -> List[tuple]:
    """The (method, seed, lr peak) cells of an lr stage in ``regime`` (the grid's first lr regime): one method per
    shared trial (`Grid.runs_in`) of the grid's lr methods, those of ``methods`` only if given, at ``peaks`` (the
    grid's)."""
    regime = regime or grid.lr_regimes[0]
    ran = grid.runs_in(regime, grid.lr_methods)
    if methods is not None:
        ran = tuple(m for m in ran if any(grid.same_run_as(regime, x, grid.lr_methods) == m for x in methods))
    return [(m, s, float(p)) for m in ran for s in grid.lr_seeds for p in (peaks or grid.lr_peaks)]


def lr_choice(curves: pd.DataFrame, grid: Grid, peaks: Optional[List[float]] = None) -> Dict:
    """The lr stage's choice from its rows: each method's best peak (``lr_per_method``), or one for every method."""
    peaks = peaks or list(grid.lr_peaks)
    if grid.lr_per_method:
        return report.choose_lr_per_method(curves, peaks, grid.target)
    return report.choose_lr(curves, peaks)


StageRows = Callable[[str, List[tuple]], pd.DataFrame]


def regime_frames(
    grid: Grid, lr_peak: Union[float, Dict[str, float]], lr_curves: pd.DataFrame, stage_rows: StageRows
) -> List[pd.DataFrame]:
    """Every regime stage's rows: the lr stage's trials at the chosen peak where it ran that regime (they are seeds of
    the regime stage already, relabelled to it), ``stage_rows(regime, cells)`` for the other cells (run them, or read
    what is saved), and for a method that shares another's trial in the regime (`Grid.same_run_as`), that trial's
    rows under its own name, with the other's in ``same_run_as``."""
    frames = []
    for name in grid.regimes:
        cells = [(m, int(s), method_peak(lr_peak, m, name)) for m in grid.runs_in(name) for s in grid.seeds]
        shared = lr_curves[lr_curves[report.STAGE] == lr_stage_name(name)] if len(lr_curves) else lr_curves
        regime = []
        if len(shared):
            have = set(_trial_cells(shared))
            kept = [c in set(cells) for c in _trial_cells(shared)]
            regime.append(shared[kept].assign(**{report.STAGE: name}))
            cells = [c for c in cells if c not in have]
        if cells:
            regime.append(stage_rows(name, cells))
        rows = report.concat(regime)
        frames.append(rows)
        for method in grid.methods_in(name):
            twin = grid.same_run_as(name, method)
            if twin != method and len(rows):
                copy = rows[rows[report.METHOD] == twin]
                frames.append(copy.assign(**{report.METHOD: method, report.SAME_RUN_AS: twin}))
    return frames


def run_sweep(out: str, grid: Grid, *, base_model: Optional[str] = None, say=print, parallel: int = 1) -> Dict:
    """Prepare, choose the lr, run every regime's experiment (``parallel`` trials at a time where that helps,
    `stage_parallelism`), then write the curves, table and figures."""
    from rllib_p3o.sweep.prep import prepare

    t0 = time.time()
    needs = {n for r in grid.regimes for n in REGIMES[r].needs}
    prepared = prepare(out, grid, needs, base_model=base_model, say=say)
    lr_peak, lr_curves = choose_lr(out, grid, prepared, say, parallel)

    def run(name: str, cells: List[tuple]) -> pd.DataFrame:
        config = regime_config(REGIMES[name], prepared, grid)
        return run_stage(
            out, name, config, cells, grid.iterations, say, parallel, overrides=trial_overrides(grid, name, prepared)
        )

    curves = report.concat([lr_curves, *regime_frames(grid, lr_peak, lr_curves, run)])
    curves.to_csv(os.path.join(out, report.CURVES_CSV), index=False)
    summary = report.write_report(out, curves, grid, lr_peak=lr_peak, wall_s=time.time() - t0)
    say(
        f"[sweep] done in {(time.time() - t0) / 60:.1f} min: {summary['table']} and {len(summary['figures'])} "
        f"figures under {out}"
    )
    return summary


def report_saved(out: str, grid: Grid) -> Dict:
    """The report (`report.write_report`) of the trials whose files are saved under ``<out>/trials``, arranged as
    `run_sweep` arranges them: a finished sweep's, with its ``curves.csv``, or a running or interrupted one's, which
    opens with how many trials are missing and writes no ``curves.csv`` (that file stands for a finished sweep).
    Before the lr stage has finished, only its table is reported: no peak is chosen from part of it."""
    counts = {"finished": 0, "missing": 0, "extending": 0}  # extending: trials at peaks an lr stage added

    def saved(stage: str, cells: List[tuple]) -> pd.DataFrame:
        rows = saved_rows(out, stage, cells)
        done = len(set(_trial_cells(rows))) if len(rows) else 0
        counts["finished"] += done
        counts["missing"] += len(cells) - done
        return rows

    lr_peak: Union[None, float, Dict[str, float]] = grid.default_lr
    lr_curves = pd.DataFrame()
    if grid.lr_choice_from:
        lr_peak = json.load(open(repository_path(grid.lr_choice_from)))["lr_peak"]
    elif grid.lr_peaks:
        chosen = os.path.join(out, LR_CHOICE)
        written = json.load(open(chosen)) if os.path.exists(chosen) else {}
        lr_peak, frames = {}, []
        for family, regimes in lr_groups(grid).items():
            tried = written.get("peaks") if family is None else written.get("families", {}).get(family, {}).get("peaks")
            peaks = [float(p) for p in (tried or grid.lr_peaks)]
            # The bracket's own peaks are counted (a missing one holds the choice back); an extension's, read as saved.
            extensions = [_extension_rows(out, lr_stage_name(r), grid.lr_peaks) for r in regimes]
            counts["extending"] += sum(len(set(_trial_cells(rows))) for rows in extensions if len(rows))
            curves = report.concat([saved(lr_stage_name(r), lr_cells(grid, r)) for r in regimes] + extensions)
            frames.append(curves)
            if counts["missing"] or lr_peak is None:
                lr_peak = None
                continue
            choice = _with_shared_runs(lr_choice(curves, grid, peaks)["lr_peak"], grid, regimes[0])
            if family is None:
                lr_peak = choice
            else:
                lr_peak.update({family_key(m, family): p for m, p in choice.items()})
        lr_curves = report.concat(frames)
    if lr_peak is None:
        frames = [lr_curves]
        counts["missing"] = grid.num_trials() - counts["finished"]
    else:
        frames = [lr_curves, *regime_frames(grid, lr_peak, lr_curves, saved)]
    curves = report.concat(frames)
    if not len(curves):
        raise FileNotFoundError(f"no finished trial under {os.path.join(out, report.TRIALS_DIR)}")
    note = None
    if counts["missing"]:
        extending = f" ({counts['extending']} of them at peaks an lr stage added)" if counts["extending"] else ""
        note = (
            f"Partial: {counts['finished'] + counts['extending']} trials finished{extending}, {counts['missing']} "
            "not yet"
            + (" (the lr stage first: no peak is chosen from part of it)" if lr_peak is None else "")
            + "; rerun the sweep's command to continue."
        )
    else:
        curves.to_csv(os.path.join(out, report.CURVES_CSV), index=False)
    return report.write_report(out, curves, grid, lr_peak=lr_peak, wall_s=None, note=note)


def _extension_rows(out: str, stage: str, bracket: Tuple[float, ...]) -> pd.DataFrame:
    """The saved rows of an lr stage's trials at peaks beyond its ``bracket`` (`Grid.lr_extend`)."""
    rows = report.read_trials(out, stage)
    if not len(rows):
        return rows
    return rows[~np.isclose(rows[report.LR_PEAK].to_numpy()[:, None], np.array(bracket)[None, :]).any(axis=1)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    grid = _grid(args)
    out = os.path.abspath(args.out)
    if args.report_only:
        return _report_only(out, grid)
    if args.fresh and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    return _run(out, grid, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rllib-p3o sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="arithmetic",
        help="arithmetic: the demo's task (the easy control); sorting: the claims bench; addition: the claims bench's "
        "second task (3-digit sums with the carries written out: docs/guide/sweep.md)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test of the whole pipeline (arithmetic: {} trials; sorting: {}), ≤ 10 min on 2 cores".format(
            GRIDS["arithmetic", "quick"].num_trials(), GRIDS["sorting", "quick"].num_trials()
        ),
    )
    size.add_argument(
        "--full",
        action="store_true",
        help="the full grid (default; arithmetic: {} trials, about an hour on 2 cores; sorting: {}, a few hours of "
        "trial time, about half of it in wall time with --parallel 2: docs/results/claims.md gives the measured times)".format(
            GRIDS["arithmetic", "full"].num_trials(), GRIDS["sorting", "full"].num_trials()
        ),
    )
    size.add_argument(
        "--development",
        action="store_true",
        help="the claims bench's development set (--task addition: the second task's, {} trials or more); with --task "
        "sorting, of --round: provenance (the default): offline data "
        "read by their provenance, each method's lr chosen per lr family and the ablation in offline_weaker ({} trials "
        "or more: the lr stage extends its bracket while a method's best peak is at an end); staleness: P3O under "
        "staleness ({} trials or more)".format(
            GRIDS["addition", "development"].num_trials(),
            GRIDS["sorting", "development"].num_trials(),
            GRIDS["sorting", "staleness-development"].num_trials(),
        ),
    )
    size.add_argument(
        "--confirmation",
        action="store_true",
        help="the claims bench's confirmation set, at its development set's committed lr choice: --task addition {} "
        "trials (results/bench-addition-development/lr_choice.json); --task sorting, of --round: provenance {} trials "
        "(results/bench-provenance-development/lr_choice.json), staleness {} (results/bench-development/"
        "lr_choice.json)".format(
            GRIDS["addition", "confirmation"].num_trials(),
            GRIDS["sorting", "confirmation"].num_trials(),
            GRIDS["sorting", "staleness-confirmation"].num_trials(),
        ),
    )
    size.add_argument(
        "--inflight",
        action="store_true",
        help="the bench's async regime with and without in-flight weight updates (sorting only; {} trials at the "
        "development set's lr choice: docs/results/inflight.md)".format(GRIDS["sorting", "inflight"].num_trials()),
    )
    parser.add_argument(
        "--out",
        default="runs/sweep",
        help="a local (or network-mounted) directory: the sweep builds its models there and resumes from its files",
    )
    parser.add_argument("--fresh", action="store_true", help="delete --out first instead of resuming it")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="trials of a sync stage run at once, sharing the cores (each gets cores / N threads); async stages run "
        "one at a time. Results do not depend on it beyond float rounding",
    )
    parser.add_argument(
        "--round",
        choices=ROUNDS,
        default=ROUNDS[0],
        help="which round's --development or --confirmation set: %(default)s (the latest: data another model "
        "recorded, docs/results/provenance.md), first-choice (--confirmation only: that round's first choice of "
        "P3O's weight on another model's tokens, on seeds 6-8) or staleness (docs/results/staleness.md)",
    )
    parser.add_argument("--regimes", nargs="+", choices=sorted(REGIMES))
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--iterations", type=int, help="iterations of 512 completions per trial")
    parser.add_argument(
        "--lr",
        type=float,
        help="peak learning rate for every method (skips the lr stage, and a committed lr choice a grid would read)",
    )
    parser.add_argument("--base-model", help="a base model directory instead of building the task's")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the table and figures from the trials saved under --out so far (a running or interrupted sweep's "
        "say how many are missing), without running any; from curves.csv where there are no trial files",
    )
    return parser


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) an ``--out`` on object storage and a ``--parallel`` below 1."""
    size = next((k for k in ("quick", "development", "confirmation", "inflight") if getattr(args, k)), "full")
    if (args.task, _size_key(args)) not in GRIDS:
        have = sorted({k[1] for k in GRIDS if k[0] == args.task and "-" not in k[1]})
        parser.error(f"--task {args.task} has no --{size} grid (its grids: {', '.join('--' + h for h in have)})")
    if storage.is_uri(args.out) and storage.uri_scheme(args.out) != "file":
        # The prepared models must be local directories (vLLM and transformers load them), and a resumed sweep reads
        # its per-trial files back: an object store cannot hold either. Refused rather than written to "./s3:".
        parser.error(
            f"--out {args.out}: the sweep needs a local or network-mounted directory (it builds its models there "
            "and resumes from its files); copy the directory to object storage afterwards"
        )

    if args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")


def _size_key(args: argparse.Namespace) -> str:
    """The grid the size flags name (``--round`` picks the claims bench's earlier development/confirmation sets)."""
    size = next((k for k in ("quick", "development", "confirmation", "inflight") if getattr(args, k)), "full")
    if size in ("development", "confirmation") and getattr(args, "round", ROUNDS[0]) != ROUNDS[0]:
        size = f"{args.round}-{size}"
    return size


def _grid(args: argparse.Namespace) -> Grid:
    """The task's quick or full grid with the regimes, methods, seeds, iterations and lr the arguments name."""
    grid = GRIDS[args.task, _size_key(args)]
    changes = {
        k: tuple(v) for k, v in (("regimes", args.regimes), ("methods", args.methods), ("seeds", args.seeds)) if v
    }
    if args.methods:
        changes["regime_methods"] = {}  # the methods named are run in every regime named
    if args.methods and grid.lr_per_method:
        changes["lr_methods"] = tuple(args.methods)
    if args.iterations:
        changes["iterations"] = args.iterations
    if args.lr:
        # One rate for every method: it replaces the lr stage and any committed choice the grid would read.
        changes.update(lr_peaks=(), default_lr=args.lr, lr_choice_from=None, lr_per_family=False)
    return Grid(**{**grid.__dict__, **changes})


def _report_only(out: str, grid: Grid) -> int:
    """``--report-only``: the report of the trials saved under ``out``, or of its ``curves.csv`` where there are no
    trial files; prints its table."""
    if os.path.isdir(os.path.join(out, report.TRIALS_DIR)):
        summary = report_saved(out, grid)
    else:  # a sweep's published outputs without its trial files: redraw from curves.csv
        lr_peak = json.load(open(os.path.join(out, LR_CHOICE)))["lr_peak"] if grid.lr_peaks else grid.default_lr
        curves = pd.read_csv(os.path.join(out, report.CURVES_CSV))
        summary = report.write_report(out, curves, grid, lr_peak=lr_peak, wall_s=None)
    print(open(summary["table"]).read())
    return 0


def _run(out: str, grid: Grid, args: argparse.Namespace) -> int:
    """Start Ray with the libraries quiet, run the sweep and print its table; 130 when it was interrupted (its
    finished trials are saved, and a rerun continues)."""
    if grid.lr_choice_from and not os.path.exists(repository_path(grid.lr_choice_from)):
        # Before Ray and the prepared models: without the file the sweep would prepare for minutes, then stop.
        print(
            f"rllib-p3o sweep: this grid runs each method at the learning rate its development set chose, read from "
            f"{grid.lr_choice_from}, which does not exist: run the development set first (`--development`, same "
            "--task) and commit its lr_choice.json there, or give one rate to every method with --lr",
            file=sys.stderr,
        )
        return 2
    import logging

    import ray

    from rllib_p3o.driver.progress import silence_driver_and_workers

    env = silence_driver_and_workers()
    # Logical CPUs beyond the cores: a trial holds 2 (its actor and the runner), Ray Data reads need their own.
    ray.init(
        num_cpus=max(8, 2 * args.parallel + 4),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": env},
    )
    try:
        print(
            f"[sweep] {grid.num_trials()} trials: regimes {', '.join(grid.regimes)}; methods "
            f"{', '.join(grid.all_methods())}; seeds {list(grid.seeds)}; {grid.iterations} iterations each → {out}",
            flush=True,
        )
        summary = run_sweep(
            out, grid, base_model=args.base_model, say=lambda line: print(line, flush=True), parallel=args.parallel
        )
    except SweepInterrupted as stop:
        print(stop, flush=True)
        return 130
    except KeyboardInterrupt:  # a Ctrl-C outside Tune's own handler (between stages, in the preparation)
        print("[sweep] interrupted: finished trials are saved; rerun the same command to continue", flush=True)
        return 130
    finally:
        ray.shutdown()
    print(open(summary["table"]).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
