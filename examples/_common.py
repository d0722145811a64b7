"""Shared by the examples: run one P3O config through tune.Tuner and summarize held-out accuracy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Tuple

if TYPE_CHECKING:
    import pandas


def run_tuner(config, name: str, storage: str, stop: dict) -> Tuple["pandas.DataFrame", Dict[str, float]]:
    from ray import tune

    import rllib_p3o  # noqa: F401  (registers "P3O")
    from rllib_p3o.progress import IterationPrinter

    result = tune.Tuner(
        "P3O", param_space=config,
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0, stop=stop,
                                  callbacks=[IterationPrinter(every=10)],
                                  failure_config=tune.FailureConfig(fail_fast="raise")),
    ).fit()[0]
    if result.error:
        raise result.error
    df = result.metrics_dataframe
    heldout = df["p3o/heldout_reward_mean"].dropna()
    reached = heldout[heldout >= 0.9]
    return df, {"heldout_before": float(heldout.iloc[0]), "heldout_after": float(heldout.iloc[-1]),
                "heldout_max": float(heldout.max()), "train_time_s": float(df["time_total_s"].iloc[-1]),
                "iterations": int(df["training_iteration"].iloc[-1]),
                "seconds_to_heldout_0.9": float(df.loc[reached.index[0], "time_total_s"]) if len(reached) else None}


def add_run_args(parser, out: str) -> None:
    """--out, --time-limit, --iterations: where a Tuner example writes and when it stops (besides the target)."""
    parser.add_argument("--out", default=out)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--iterations", type=int, default=1000)


def start(out: str) -> str:
    """Build (or reuse) the demo base model under ``out`` and start Ray; returns the model path."""
    import os

    import ray

    from rllib_p3o.tasks import build_demo_model

    model = build_demo_model(os.path.join(out, "base_model"))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    return model


def stop_at(target: float, time_limit: float, iterations: int):
    def stop(trial_id: str, result: dict) -> bool:
        heldout = result.get("p3o", {}).get("heldout_reward_mean", float("nan"))
        return heldout >= target or result["time_total_s"] >= time_limit or result["training_iteration"] >= iterations
    return stop


def write_summary(summary: dict, out: str) -> None:
    """Save summary.json under ``out``, print it and shut Ray down (the common end of every example)."""
    import json
    import os

    import ray

    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    ray.shutdown()
