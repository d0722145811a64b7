"""What a person sees of a long run: the libraries silenced in a script's driver and its workers, a status table
with a row per iteration (a Tune callback), the training curves.

Two functions keep the libraries quiet, each with its own job: `rllib_p3o.core.quiet.quiet_libraries` is what
``import rllib_p3o`` does in every process by default (chatter below ERROR hidden, ``RLLIB_P3O_VERBOSE=1`` shows
it); `silence_driver_and_workers` is for a script's driver, before Ray starts: it silences more (every
DeprecationWarning, FutureWarning and UserWarning, whatever ``RLLIB_P3O_VERBOSE`` says) and returns the environment
that does the same in Ray's workers."""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

from ray import tune

from rllib_p3o.core import metrics, quiet
from rllib_p3o.driver import wait_notices
from rllib_p3o.driver.wait_notices import WaitNotices

if TYPE_CHECKING:
    import pandas

# `silence_driver_and_workers`' settings: those ``import rllib_p3o`` applies by default (`rllib_p3o.core.quiet`), and
# Tune's classic output engine and every Python warning for the worker processes. Errors still show.
QUIET_ENV = {
    **quiet.QUIET_ENV,
    "RAY_DEDUP_LOGS": "1",
    "RAY_AIR_NEW_OUTPUT": "0",  # Tune's classic output: with verbose=0 no config box or TensorBoard hint
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning,ignore::UserWarning",
}


def silence_driver_and_workers() -> Dict[str, str]:
    """Silence Ray/RLlib/Tune, transformers and vLLM below ERROR, and every DeprecationWarning, FutureWarning and
    UserWarning, in this process (a script's driver), whatever ``RLLIB_P3O_VERBOSE`` says; returns the environment
    variables that do the same in Ray's workers (``ray.init(runtime_env={"env_vars": ...})``). Call it before those
    libraries start. ``import rllib_p3o`` already does most of this by default, in every process
    (`rllib_p3o.core.quiet.quiet_libraries`)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    # "ray.rllib" by name: RLlib gives that logger a level of its own, which the parent's would not override.
    for name in ("ray", "ray.rllib", "ray.tune", "vllm", "transformers", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return dict(QUIET_ENV)


# Status-table columns named in `IterationPrinter.columns_for` (the others are named where the table is built): the
# data's age in weight versions (mean/largest), the share of completions spanning versions, samples dropped as stale.
AGE = "age"
SPANNING = "spanning"
DROPPED = "dropped"
# The trial config's keys that add the async columns (`rllib_p3o.core.settings`).
ASYNC_SAMPLING = "async_sampling"
INFLIGHT_WEIGHT_UPDATES = "inflight_weight_updates"

# (column in Tune's flattened results, label)
CURVES = (
    (metrics.column(metrics.P3O, metrics.REWARD_MEAN), "train reward (mean of sampled completions)"),
    (metrics.column(metrics.P3O, metrics.HELDOUT_REWARD_MEAN), "held-out accuracy (greedy, verifier)"),
    (metrics.column(*metrics.LEARNER, metrics.ESS), "ESS of the training batch"),
)


def _fmt(v, spec: str = "{:.3f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class IterationPrinter(tune.Callback):
    """A status table with one row every ``every`` iterations: the iteration, elapsed time and the longest time left,
    train reward, held-out reward (the latest evaluation), ESS, tokens/s (generated tokens per second over the last
    iterations: `rllib_p3o.core.metrics.RECENT_TOKENS_PER_S`), the age of the policy's data in weight versions
    (``age``: mean/largest; 0.0/0 in sync mode), the share of groups without signal, the completions no reward
    function scored (``unscored``; the first iteration with any prints a warning above its row) and where the
    iteration's time went. With ``async_sampling`` (the trial's config says it), the samples dropped as too stale
    (``dropped``); with ``inflight_weight_updates``, the share of completions whose tokens span weight versions
    (``spanning``).

    Before the first row, a line names what the run waits for once a wait has lasted 10 s (the trial's start, then
    the first iteration: `rllib_p3o.driver.wait_notices`).

    With Tune's own status table off (``tune.RunConfig(verbose=0)``: no config box either), it is the screen of a
    run: ``tune.RunConfig(..., callbacks=[IterationPrinter()], verbose=0)``. With ``time_limit`` (seconds of
    training) and/or ``max_iterations`` the row gives the longest time left until the run stops (a target can only
    end it sooner), from the mean iteration time so far; Tune's ``stop={"training_iteration": N}`` counts too.
    """

    # (name, width): every run's columns; `columns_for` adds the async ones after AGE.
    COLUMNS = (
        ("iter", 6),
        ("time", 7),
        ("left", 7),
        ("reward", 8),
        ("held-out", 9),
        ("ESS", 7),
        ("tokens/s", 9),
        (AGE, 8),
        ("w/o signal", 11),
        ("unscored", 9),
        ("gen s", 7),
        ("train s", 8),
        ("sync s", 7),
    )
    SPANNING_COLUMN = (SPANNING, 9)
    DROPPED_COLUMN = (DROPPED, 8)

    def __init__(
        self,
        every: int = 1,
        time_limit: Optional[float] = None,
        max_iterations: Optional[int] = None,
        target: Optional[float] = None,
    ):
        self.every = every
        self.time_limit = time_limit
        self.max_iterations = max_iterations
        self.target = target
        self._header_printed = False
        self._warned_unscored = False
        self._waits = WaitNotices()
        self._results_seen = False
        self._columns: Optional[Tuple[Tuple[str, int], ...]] = None  # the first result's trial decides them

    @classmethod
    def columns_for(cls, config: Mapping[str, Any]) -> Tuple[Tuple[str, int], ...]:
        """The table's columns for a trial's ``config``: with async sampling the samples dropped as too stale, with
        in-flight weight updates the share of completions spanning versions too (both after ``age``)."""
        extra = ()
        if config.get(INFLIGHT_WEIGHT_UPDATES):
            extra = (cls.SPANNING_COLUMN, cls.DROPPED_COLUMN)
        elif config.get(ASYNC_SAMPLING):
            extra = (cls.DROPPED_COLUMN,)
        at = [name for name, _ in cls.COLUMNS].index(AGE) + 1
        return cls.COLUMNS[:at] + extra + cls.COLUMNS[at:]

    @property
    def columns(self) -> Tuple[Tuple[str, int], ...]:
        return self._columns if self._columns is not None else self.COLUMNS

    def _time_left(self, it: int, elapsed: float, max_iterations: Optional[int] = None) -> Optional[float]:
        bounds = []
        max_iterations = self.max_iterations if self.max_iterations is not None else max_iterations
        if self.time_limit is not None:
            bounds.append(self.time_limit - elapsed)
        if max_iterations is not None and it > 0:
            bounds.append((max_iterations - it) * elapsed / it)
        return min(bounds) if bounds else None

    def header(self) -> str:
        target = f"   (held-out target {self.target:.2f})" if self.target is not None else ""
        return "".join(f"{name:>{width}}" for name, width in self.columns) + target

    def row(self, result: Dict, max_iterations: Optional[int] = None) -> str:
        """The table row of one result (`rllib_p3o.core.metrics.SUMMARY` and p3o/ figures)."""
        it = result.get("training_iteration", 0)
        p = result.get(metrics.P3O, {})
        elapsed = result.get("time_total_s", 0.0)
        left = self._time_left(it, elapsed, max_iterations)
        age = p.get(metrics.STALENESS_MEAN), p.get(metrics.STALENESS_MAX)
        cells = {
            "iter": str(it),
            "time": _clock(elapsed),
            "left": "≤" + _clock(left) if left is not None else "-",
            "reward": _fmt(result.get(metrics.REWARD)),
            "held-out": _fmt(result.get(metrics.HELDOUT_REWARD)),
            "ESS": _fmt(result.get(metrics.SUMMARY_ESS)),
            "tokens/s": _fmt(result.get(metrics.TOKENS_PER_S), "{:.0f}"),
            AGE: f"{_fmt(age[0], '{:.1f}')}/{_fmt(age[1], '{:.0f}')}" if _present(age[0]) else "-",
            SPANNING: _fmt(p.get(metrics.SPANNING_VERSIONS_SHARE), "{:.2f}"),
            DROPPED: _fmt(p.get(metrics.DROPPED_STALE_SAMPLES), "{:.0f}"),
            "w/o signal": _fmt(p.get(metrics.GROUPS_WITHOUT_SIGNAL)),
            "unscored": _fmt(p.get(metrics.UNSCORABLE_COMPLETIONS), "{:.0f}"),
            "gen s": _fmt(p.get(metrics.TIME_GENERATE_S), "{:.2f}"),
            "train s": _fmt(p.get(metrics.TIME_TRAIN_S), "{:.2f}"),
            "sync s": _fmt(p.get(metrics.TIME_SYNC_S), "{:.2f}"),
        }
        return "".join(f"{cells[name]:>{width}}" for name, width in self.columns)

    def __setstate__(self, state: Dict) -> None:
        """Unpickled with a run that Tune restores: a printer pickled by an earlier version gets the wait notices."""
        self.__dict__.update(state)
        self.__dict__.setdefault("_waits", WaitNotices())
        self.__dict__.setdefault("_results_seen", False)
        self.__dict__.setdefault("_columns", None)

    def setup(self, **info):
        self._waits.begin(wait_notices.STARTING)

    def on_trial_start(self, iteration, trials, trial, **info):
        """(Tune calls it once the trial's actor is built: engines started, first weights pushed.)"""
        if not self._results_seen:
            self._waits.begin(wait_notices.FIRST_ITERATION)

    def on_trial_recover(self, iteration, trials, trial, **info):
        if not self._results_seen:
            self._waits.begin(wait_notices.STARTING)

    def on_step_begin(self, iteration, trials, **info):
        notice = self._waits.due()
        if notice is not None:
            print(notice, flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self._columns is None:
            self._columns = self.columns_for(getattr(trial, "config", None) or result.get("config") or {})
        self._results_seen = True
        self._waits.end()
        it = result.get("training_iteration", 0)
        p = result.get(metrics.P3O, {})
        unscored = p.get(metrics.UNSCORABLE_COMPLETIONS) or 0
        if unscored > 0 and not self._warned_unscored:  # on the screen, whichever rows this printer shows
            print(unscored_warning(it, unscored, p.get(metrics.NUM_COMPLETIONS)), flush=True)
            self._warned_unscored = True
        if it % self.every and it != 1:
            return
        if not self._header_printed and p.get(metrics.OFFLINE_FILES_POLICY) is not None:
            print(offline_provenance_line(p), flush=True)
        if not self._header_printed:
            print(self.header(), flush=True)
            self._header_printed = True
        # Tune's stop={"training_iteration": N}, when the run stops at a fixed iteration.
        stop = getattr(trial, "stopping_criterion", None) or {}
        print(self.row(result, stop.get("training_iteration") if isinstance(stop, dict) else None), flush=True)


# How `heldout_summary` begins, for a script's screen and for the tests that read it.
HELDOUT_SUMMARY = "held-out reward"


def heldout_summary(result: Any) -> str:
    """The line a script prints after ``Tuner.fit()``: the held-out reward of the trial's latest evaluation (a Tune
    ``Result``), with what it is of. An evaluation runs at the start of an iteration, of the first one and then
    every ``eval_interval`` iterations, so the latest is of the policy some updates before the end, and in a run
    shorter than ``eval_interval`` it is the base model's: the top-level ``heldout_reward`` alone does not say so."""
    iterations = int((result.metrics or {}).get("training_iteration") or 0)
    column = metrics.column(metrics.P3O, metrics.HELDOUT_REWARD_MEAN)
    frame = result.metrics_dataframe
    if frame is None or column not in frame or frame[column].isna().all():
        return (
            f"{HELDOUT_SUMMARY}: none (no evaluation in the run's {iterations} iterations: eval_dataset, eval_interval)"
        )
    latest = frame.dropna(subset=[column]).iloc[-1]
    value, updates = float(latest[column]), int(latest["training_iteration"]) - 1  # taken before that iteration's
    if updates == 0:
        return (
            f"{HELDOUT_SUMMARY} {value:.3f} of the base model, before any update: the run's {iterations} iteration(s) "
            "held no later evaluation (one at the start of every eval_interval-th iteration)"
        )
    return f"{HELDOUT_SUMMARY} {value:.3f} after {updates} of the run's {iterations} iterations (its latest evaluation)"


def offline_provenance_line(p3o_result: Dict) -> str:
    """The first screen's line on whose data the offline files are (`rllib_p3o.data.provenance`)."""
    own = int(p3o_result.get(metrics.OFFLINE_FILES_POLICY) or 0)
    other = int(p3o_result.get(metrics.OFFLINE_FILES_OTHER_MODEL) or 0)
    return (
        f"offline data: {own} file(s) read as the policy's own data (trust region, KL toward their sampler), {other} "
        "as another model's (neither; files that record no model are another model's). Per file and why: "
        "rllib-p3o validate PATH --model MODEL; to say otherwise: training(offline_provenance=...)"
    )


def unscored_warning(iteration: int, unscored: float, completions: Optional[float]) -> str:
    """The warning of the first iteration with completions no reward function scored: without it they would only be
    a count in result.json, and a reward function that returns None for most rows trains on what is left."""
    of = f" of {completions:.0f}" if completions else ""
    return (
        f"warning: iteration {iteration}: {unscored:.0f}{of} completions unscored: every reward function returned None "
        "for them, so they get no reward and advantage 0 (they teach nothing). If that is not meant, check the "
        "functions on the dataset: rllib-p3o validate DATASET --reward-fn module:function. The status table's "
        "'unscored' column counts them each iteration."
    )


def plot_training_curves(
    frames: Dict[str, "pandas.DataFrame"],
    path: str,
    title: str = "P3O training",
    curves: Sequence = CURVES,
    x: str = "time_total_s",
) -> str:
    """One panel per curve, one line per run (``frames``: label → Tune ``metrics_dataframe``); saves a PNG.

    ``x="training_iteration"`` compares runs that did not have the machine to themselves.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6))
    for ax, (column, label) in zip(axes, curves):
        for run, df in frames.items():
            if column in df:
                d = df[[x, column]].dropna()
                ax.plot(d[x], d[column], label=run, marker="." if len(d) < 80 else None)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("training time (s)" if x == "time_total_s" else x.replace("_", " "))
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
