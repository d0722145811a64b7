"""What a person sees of a long run: quiet libraries, a one-line-per-iteration Tune callback, the training curves."""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from ray import tune

from rllib_p3o.core import metrics

if TYPE_CHECKING:
    import pandas

# Settings that keep library chatter (start-up banners, deprecation notices, weight-loading bars) off the user's
# screen. Errors still show: only levels below ERROR are hidden.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "1",
    "RAY_AIR_NEW_OUTPUT": "0",  # Tune's classic output: with verbose=0 no config box or TensorBoard hint
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning,ignore::UserWarning",
}


def quiet_library_output() -> Dict[str, str]:
    """Silence Ray/RLlib/Tune, transformers and vLLM below ERROR in this process; returns the environment variables
    to hand to Ray workers (``ray.init(runtime_env={"env_vars": ...})``). Call it before those libraries start."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    # "ray.rllib" by name: RLlib gives that logger a level of its own, which the parent's would not override.
    for name in ("ray", "ray.rllib", "ray.tune", "vllm", "transformers", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return dict(QUIET_ENV)


# (column in Tune's flattened results, label)
CURVES = (
    (metrics.column(metrics.P3O, metrics.REWARD_MEAN), "train reward (mean of sampled completions)"),
    (metrics.column(metrics.P3O, metrics.HELDOUT_REWARD_MEAN), "held-out accuracy (greedy, verifier)"),
    (metrics.column(*metrics.LEARNER, metrics.ESS), "ESS of the training batch"),
)


def _fmt(v) -> str:
    return "   -  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:6.3f}"


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class IterationPrinter(tune.Callback):
    """One line every ``every`` iterations: elapsed time, ETA, train reward, held-out accuracy, ESS, signal, time split.

    With ``time_limit`` (seconds of training) and/or ``max_iterations`` the line gives the longest time left until
    the run stops (the target, if any, can only end it sooner), from the mean iteration time so far.
    """

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
        self._t0: Optional[float] = None

    def _time_left(self, it: int, elapsed: float) -> Optional[float]:
        bounds = []
        if self.time_limit is not None:
            bounds.append(self.time_limit - elapsed)
        if self.max_iterations is not None and it > 0:
            bounds.append((self.max_iterations - it) * elapsed / it)
        return min(bounds) if bounds else None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._t0 = self._t0 or time.time()
        it = result.get("training_iteration", 0)
        if it % self.every and it != 1:
            return
        p = result.get(metrics.P3O, {})
        lr = metrics.lookup(result, *metrics.LEARNER) or {}
        elapsed = result.get("time_total_s", 0.0)
        left = self._time_left(it, elapsed)
        eta = f"  ≤{_clock(left)} left" if left is not None else ""
        target = f" (target {self.target:.2f})" if self.target is not None else ""
        print(
            f"iter {it:4d}  {_clock(elapsed)} elapsed{eta}  reward {_fmt(p.get(metrics.REWARD_MEAN))}  "
            f"held-out {_fmt(p.get(metrics.HELDOUT_REWARD_MEAN))}{target}  ess {_fmt(lr.get(metrics.ESS))}  "
            f"groups w/o signal {_fmt(p.get(metrics.GROUPS_WITHOUT_SIGNAL))}  "
            f"gen {p.get(metrics.TIME_GENERATE_S, 0):.2f}s train {p.get(metrics.TIME_TRAIN_S, 0):.2f}s "
            f"sync {p.get(metrics.TIME_SYNC_S, 0):.2f}s",
            flush=True,
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
