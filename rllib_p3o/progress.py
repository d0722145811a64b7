"""Readable progress for long runs: a one-line-per-iteration Tune callback and the training-curve plot."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from ray import tune

if TYPE_CHECKING:
    import pandas

# (column in Tune's flattened results, label)
CURVES = (
    ("p3o/reward_mean", "train reward (mean of sampled completions)"),
    ("p3o/heldout_reward_mean", "held-out accuracy (greedy, verifier)"),
    ("learners/default_policy/ess", "ESS of the training batch"),
)


def _get(result: Dict, path: str):
    node = result
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _fmt(v) -> str:
    return "   -  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:6.3f}"


class IterationPrinter(tune.Callback):
    """Prints iteration, wall time, train reward, held-out accuracy, ESS, cap fraction and the time split."""

    def __init__(self, every: int = 1):
        self.every = every
        self._t0: Optional[float] = None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._t0 = self._t0 or time.time()
        it = result.get("training_iteration", 0)
        if it % self.every and it != 1:
            return
        p = result.get("p3o", {})
        lr = _get(result, "learners/default_policy") or {}
        print(f"[{trial.trial_id}] iter {it:4d}  {result.get('time_total_s', 0):6.0f}s  "
              f"reward {_fmt(p.get('reward_mean'))}  heldout {_fmt(p.get('heldout_reward_mean'))}  "
              f"ess {_fmt(lr.get('ess'))}  cap {_fmt(lr.get('cap_fraction'))}  "
              f"gen {p.get('time_generate_s', 0):.2f}s train {p.get('time_train_s', 0):.2f}s "
              f"sync {p.get('time_sync_s', 0):.2f}s", flush=True)


def plot_training_curves(frames: Dict[str, "pandas.DataFrame"], path: str, title: str = "P3O training",
                         curves: Sequence = CURVES, x: str = "time_total_s") -> str:
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
