"""Shared by the examples: quiet start-up (base model + Ray), one P3O config through tune.Tuner, the summary."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

if TYPE_CHECKING:
    import pandas

# Held-out accuracy at which the examples call a run successful (and stop it).
DEFAULT_TARGET = 0.9
# Iterations between the examples' checkpoints (and one at the end).
CHECKPOINT_EVERY = 10


def add_run_args(parser, out: str) -> None:
    """--out, --target, --time-limit, --iterations: where a Tuner example writes and when it stops."""
    parser.add_argument("--out", default=out)
    parser.add_argument(
        "--target",
        type=float,
        default=DEFAULT_TARGET,
        help="stop (successfully) once greedy held-out accuracy reaches this",
    )
    parser.add_argument("--time-limit", type=float, default=600.0, help="stop after this many seconds of training")
    parser.add_argument("--iterations", type=int, default=1000, help="stop after this many iterations")


def start(
    out: str,
    *,
    base_seed: int = 0,
    threads: Optional[int] = None,
    pretrain_steps: int = 1500,
    progress: Optional[Callable[[int, float], None]] = None,
) -> str:
    """Quiet the libraries, build (or reuse) the demo base model under ``out`` and start Ray; returns the model path.

    ``threads`` sets torch's thread count for the base model's pretraining (it decides that model's floats).
    """
    import logging

    import ray
    import torch

    from rllib_p3o.driver.progress import silence_driver_and_workers
    from rllib_p3o.tasks import build_demo_model

    env = silence_driver_and_workers()
    if threads:
        torch.set_num_threads(threads)
    model = build_demo_model(
        os.path.join(out, "base_model"), seed=base_seed, pretrain_steps=pretrain_steps, progress=progress
    )
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": env},
    )
    return model


def stop_at(target: float, time_limit: float, iterations: int):
    from rllib_p3o.core import metrics

    def stop(trial_id: str, result: dict) -> bool:
        heldout = result.get(metrics.P3O, {}).get(metrics.HELDOUT_REWARD_MEAN, float("nan"))
        return heldout >= target or result["time_total_s"] >= time_limit or result["training_iteration"] >= iterations

    return stop


def run_tuner(
    config,
    name: str,
    storage: str,
    stop,
    *,
    target: float = DEFAULT_TARGET,
    print_every: int = 10,
    time_limit: Optional[float] = None,
    max_iterations: Optional[int] = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> Tuple["pandas.DataFrame", Dict]:
    """Train ``config`` with ``tune.Tuner("P3O")`` until ``stop``; returns the metrics and `summarize`'s summary,
    with ``checkpoint``, the final checkpoint's path.

    Checkpoints every ``checkpoint_every`` iterations and at the end, so that an interrupted run resumes with
    ``tune.Tuner.restore(f"{storage}/{name}", trainable="P3O", resume_errored=True)``. A failed trial's error is
    printed once (by Tune); the script then exits with status 1. An interrupted run (Ctrl-C) prints the call that
    resumes it, and the script exits with status 130 instead of reporting the unfinished run's numbers
    (`rllib_p3o.driver.interruption.exit_unless_finished`).
    """
    from ray import tune

    import rllib_p3o  # noqa: F401  (registers "P3O")
    from rllib_p3o.driver.interruption import exit_unless_finished
    from rllib_p3o.driver.progress import IterationPrinter

    printer = IterationPrinter(every=print_every, time_limit=time_limit, max_iterations=max_iterations, target=target)
    results = tune.Tuner(
        "P3O",
        param_space=config,
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            verbose=0,
            stop=stop,
            callbacks=[printer],
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=checkpoint_every, checkpoint_at_end=True, num_to_keep=2
            ),
        ),
    ).fit()
    exit_unless_finished(results)  # a failed trial (its error printed above by Tune) or Ctrl-C: exit non-zero
    result = results[0]
    df = result.metrics_dataframe
    summary = summarize(df, target)
    summary["checkpoint"] = result.checkpoint.path
    return df, summary


def summarize(df: "pandas.DataFrame", target: float = DEFAULT_TARGET) -> Dict:
    """Held-out accuracy before/after/best, whether and when it reached ``target``, iterations and training time."""
    from rllib_p3o.core import metrics

    heldout = df[metrics.column(metrics.P3O, metrics.HELDOUT_REWARD_MEAN)].dropna()
    reached = heldout[heldout >= target]
    first = reached.index[0] if len(reached) else None
    return {
        "heldout_before": float(heldout.iloc[0]),
        "heldout_after": float(heldout.iloc[-1]),
        "heldout_max": float(heldout.max()),
        "target": target,
        "target_reached": first is not None,
        "seconds_to_target": float(df.loc[first, "time_total_s"]) if first is not None else None,
        "iterations_to_target": int(df.loc[first, "training_iteration"]) if first is not None else None,
        "train_time_s": float(df["time_total_s"].iloc[-1]),
        "iterations": int(df["training_iteration"].iloc[-1]),
    }


def write_summary(summary: dict, out: str, echo: bool = True) -> str:
    """Save summary.json under ``out`` (and print it) and shut Ray down: the common end of every example."""
    import json

    import ray

    path = os.path.join(out, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)
    if echo:
        print(json.dumps(summary, indent=2))
    ray.shutdown()
    return path
