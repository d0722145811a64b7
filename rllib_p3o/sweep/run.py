"""``rllib-p3o sweep``: the paper's comparisons on the built-in task as Ray Tune experiments, resumable.

    rllib-p3o sweep [--quick | --full] [--out runs/sweep] [--fresh] [--regimes ...] [--methods ...] [--seeds ...]
                    [--iterations N] [--lr PEAK] [--report-only]

Stages, each one Tune experiment under ``<out>``: ``lr`` (the learning-rate choice: each candidate peak for P3O and
GRPO ε=0.2 on the on-policy regime; the peak whose worse method does best is used by every method; skipped with
``--lr`` or an empty candidate list), then one per regime (methods × seeds, `rllib_p3o.sweep.grid`).
Within a stage, trials share one Tune actor (``reuse_actors=True``; `P3O.reset_config` keeps the vLLM runner and
rebuilds the learner), so only the first trial of a stage pays the start-up.

Resume: a rerun with the same ``--out`` skips finished stages and continues an interrupted one with
``tune.Tuner.restore`` (finished trials are not run again; unfinished ones start over). ``--fresh`` starts over.

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
from typing import Dict, List, Optional

from ray import tune

from rllib_p3o.core import metrics
from rllib_p3o.sweep import report
from rllib_p3o.sweep.grid import (
    FULL,
    METHOD,
    METHOD_KEYS,
    METHODS,
    QUICK,
    REGIMES,
    Grid,
    Prepared,
    lr_schedule,
    method_value,
    regime_config,
)

LR_STAGE = "lr"
LR_CHOICE = "lr_choice.json"


class StageProgress(tune.Callback):
    """One line per finished trial: the stage's progress and an ETA from the trials finished in this process."""

    def __init__(self, stage: str, num_trials: int):
        self.stage, self.num_trials = stage, num_trials
        self.setup()

    def setup(self, **info) -> None:  # (also called by Tune when a restored experiment starts)
        self.t0, self.finished_here = time.time(), 0
        self.heldout: Dict[str, float] = {}  # trial id -> its last held-out evaluation

    def on_trial_result(self, iteration, trials, trial, result, **info):
        value = result.get(metrics.P3O, {}).get(metrics.HELDOUT_REWARD_MEAN)
        if value is not None and value == value:
            self.heldout[trial.trial_id] = value

    def _line(self, trial, text: str) -> None:
        self.finished_here += 1
        done = sum(t is trial or t.status in ("TERMINATED", "ERROR") for t in self._trials)
        left = self.num_trials - max(done, self.finished_here)
        eta = (time.time() - self.t0) / self.finished_here * left
        print(f"[{self.stage}] {_trial_name(trial)}: {text}; {left} trials left, ~{eta / 60:.1f} min", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._trials = trials
        r = trial.last_result or {}
        self._line(
            trial,
            f"{r.get('training_iteration', 0)} it, held-out "
            f"{self.heldout.get(trial.trial_id, float('nan')):.3f} at the last eval, "
            f"{r.get('time_total_s', 0):.0f} s",
        )

    def on_trial_error(self, iteration, trials, trial, **info):
        self._trials = trials
        self._line(trial, f"ERROR (see {trial.local_path}/error.txt)")


def _trial_name(trial) -> str:
    return "{}_seed{}_lr{:g}".format(*_cell(trial.config))


def run_stage(out: str, stage: str, param_space: Dict, iterations: int, cells: List[tuple], say=print):
    """Run (or resume, or skip when finished) the Tune experiment ``<out>/<stage>`` whose trials are ``cells``
    ((method, seed, lr peak) each); returns its ResultGrid."""
    path = os.path.join(out, stage)
    trials = _saved_trials(path)
    if trials is not None:
        found = sorted(_cell(t.config) for t in trials)
        if not set(found) <= set(cells):
            raise SystemExit(
                f"{path} holds another grid ({len(found)} trials: {found[:3]}...) than this command's "
                f"({len(cells)}: {sorted(cells)[:3]}...); pass --fresh, or another --out."
            )
        if found == sorted(cells) and all(t.status == "TERMINATED" for t in trials):
            say(f"[{stage}] finished earlier: {len(cells)} trials, not run again")
            return tune.Tuner.restore(path, trainable="P3O", param_space=param_space).get_results()
        say(f"[{stage}] continuing the interrupted experiment (finished trials are kept)")
        # The param space again: Tune stores objects it cannot serialize as placeholders that need it.
        tuner = tune.Tuner.restore(
            path, trainable="P3O", resume_errored=False, restart_errored=True, param_space=param_space
        )
    else:
        say(f"[{stage}] {len(cells)} trials × {iterations} iterations")
        tuner = tune.Tuner(
            "P3O",
            param_space=param_space,
            tune_config=tune.TuneConfig(
                reuse_actors=True,
                max_concurrent_trials=1,
                trial_dirname_creator=_trial_name,
                trial_name_creator=_trial_name,
            ),
            run_config=tune.RunConfig(
                name=stage,
                storage_path=out,
                verbose=0,
                callbacks=[StageProgress(stage, len(cells))],
                stop={"training_iteration": iterations},
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
    return tuner.fit()


def _saved_trials(path: str):
    """The trials of the experiment saved at ``path`` (run or not); None when there is none, or when it was
    interrupted before Tune saved its first state (then it is deleted, to start over)."""
    if not tune.Tuner.can_restore(path):
        return None
    try:
        return tune.ExperimentAnalysis(path).trials
    except ValueError:  # no experiment_state file yet
        shutil.rmtree(path)
        return None


def _cell(config: Dict) -> tuple:
    lr = config["lr"]
    return config[METHOD], int(config["seed"]), float(lr[-1][-1] if isinstance(lr, list) else lr)


def _cells(methods, seeds, peaks) -> List[tuple]:
    return [(m, int(s), float(p)) for m in methods for s in seeds for p in peaks]


def stage_space(config, methods: List[str], seeds: List[int], lr_peaks: List[float]) -> Dict:
    """Tune's param space: the regime's config as a dict, a grid over method × seed × lr peak."""
    space = config.to_dict()
    space[METHOD] = tune.grid_search(list(methods))
    for key in METHOD_KEYS:
        space[key] = tune.sample_from(functools.partial(method_value, key))
    space["seed"] = tune.grid_search(list(seeds))
    space["lr"] = (
        tune.grid_search([lr_schedule(p) for p in lr_peaks]) if len(lr_peaks) > 1 else lr_schedule(lr_peaks[0])
    )
    return space


def choose_lr(out: str, grid: Grid, prepared: Prepared, say=print) -> float:
    """The lr stage (or the given lr): the peak whose worse method (mean held-out at the budget) is best."""
    path = os.path.join(out, LR_CHOICE)
    if not grid.lr_peaks:
        return grid.default_lr
    if os.path.exists(path):
        return float(json.load(open(path))["lr_peak"])
    config = regime_config(REGIMES[grid.lr_regime], prepared, grid)
    space = stage_space(config, list(grid.lr_methods), list(grid.lr_seeds), list(grid.lr_peaks))
    results = run_stage(
        out, LR_STAGE, space, grid.iterations, _cells(grid.lr_methods, grid.lr_seeds, grid.lr_peaks), say
    )
    curves = report.collect(results, LR_STAGE, config.train_batch_rows)
    choice = report.choose_lr(curves, grid.lr_peaks)
    with open(path, "w") as f:
        json.dump(choice, f, indent=2)
    say(f"[{LR_STAGE}] chosen peak lr {choice['lr_peak']:g} ({choice['why']})")
    return float(choice["lr_peak"])


def run_sweep(out: str, grid: Grid, *, base_model: Optional[str] = None, say=print) -> Dict:
    """Prepare, choose the lr, run every regime's experiment, then write the curves, table and figures."""
    from rllib_p3o.sweep.prep import prepare

    t0 = time.time()
    needs = {n for r in grid.regimes for n in REGIMES[r].needs}
    prepared = prepare(out, grid, needs, base_model=base_model, say=say)
    lr_peak = choose_lr(out, grid, prepared, say)
    frames = []
    for name in grid.regimes:
        config = regime_config(REGIMES[name], prepared, grid)
        results = run_stage(
            out,
            name,
            stage_space(config, list(grid.methods), list(grid.seeds), [lr_peak]),
            grid.iterations,
            _cells(grid.methods, grid.seeds, [lr_peak]),
            say,
        )
        frames.append(report.collect(results, name, config.train_batch_rows))
    curves = report.concat(frames)
    curves.to_csv(os.path.join(out, report.CURVES_CSV), index=False)
    summary = report.write_report(out, curves, grid, lr_peak=lr_peak, wall_s=time.time() - t0)
    say(
        f"[sweep] done in {(time.time() - t0) / 60:.1f} min: {summary['table']} and {len(summary['figures'])} "
        f"figures under {out}"
    )
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rllib-p3o sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"{QUICK.num_trials()} trials, ≤ 10 min on 2 cores")
    size.add_argument("--full", action="store_true", help=f"{FULL.num_trials()} trials (default), ≤ 90 min")
    parser.add_argument("--out", default="runs/sweep")
    parser.add_argument("--fresh", action="store_true", help="delete --out first instead of resuming it")
    parser.add_argument("--regimes", nargs="+", choices=sorted(REGIMES))
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--iterations", type=int, help="iterations of 512 completions per trial")
    parser.add_argument("--lr", type=float, help="peak learning rate for every method (skips the lr stage)")
    parser.add_argument("--base-model", help="a base model directory instead of building the demo's")
    parser.add_argument("--report-only", action="store_true", help="redraw table and figures from curves.csv")
    args = parser.parse_args(argv)

    grid = QUICK if args.quick else FULL
    changes = {
        k: tuple(v) for k, v in (("regimes", args.regimes), ("methods", args.methods), ("seeds", args.seeds)) if v
    }
    if args.iterations:
        changes["iterations"] = args.iterations
    if args.lr:
        changes.update(lr_peaks=(), default_lr=args.lr)
    grid = Grid(**{**grid.__dict__, **changes})
    out = os.path.abspath(args.out)
    if args.report_only:
        import pandas

        lr_peak = json.load(open(os.path.join(out, LR_CHOICE)))["lr_peak"] if grid.lr_peaks else grid.default_lr
        summary = report.write_report(
            out, pandas.read_csv(os.path.join(out, report.CURVES_CSV)), grid, lr_peak=lr_peak, wall_s=None
        )
        print(open(summary["table"]).read())
        return 0
    if args.fresh and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)

    import logging

    import ray

    from rllib_p3o.progress import quiet_library_output

    env = quiet_library_output()
    # Logical CPUs beyond the cores: a trial holds 2 (its actor and the runner), Ray Data reads need their own.
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": env},
    )
    try:
        print(
            f"[sweep] {grid.num_trials()} trials: regimes {', '.join(grid.regimes)}; methods "
            f"{', '.join(grid.methods)}; seeds {list(grid.seeds)}; {grid.iterations} iterations each → {out}",
            flush=True,
        )
        summary = run_sweep(out, grid, base_model=args.base_model, say=lambda line: print(line, flush=True))
    finally:
        ray.shutdown()
    print(open(summary["table"]).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
