"""Record a P3O run to Parquet, then train a fresh policy from the recording: offline-only and mixed with online.

    python examples/offline_parquet.py [--out runs/offline] [--record-iterations 200] [--iterations 150]

1. Online P3O on the demo task via ``tune.Tuner``, with ``record_rollouts=<out>/trajectories``: every sampled
   batch is written as trajectory Parquet (prompt/completion ids and text, reward, behavior log-probs of the
   sampling policy, policy version, sampling parameters). The files are checked with ``rllib-p3o validate``.
2. A fresh copy of the base model trained only from those files (RLlib offline path, Ray Data). One vLLM runner
   exists only for the greedy held-out evaluation; nothing is sampled. The recording spans many policy versions,
   and the ESS shows how far off-policy each batch is for the current learner.
3. The same, with half of each batch from the recording and half from fresh online rollouts.
Held-out accuracy of the fresh model before and after each run is printed and saved to summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def _tune(config, name: str, out: str, iterations: int):
    from ray import tune

    from rllib_p3o.progress import IterationPrinter

    result = tune.Tuner(
        "P3O", param_space=config,
        run_config=tune.RunConfig(name=name, storage_path=out, verbose=0, stop={"training_iteration": iterations},
                                  callbacks=[IterationPrinter(every=10)],
                                  failure_config=tune.FailureConfig(fail_fast="raise")),
    ).fit()[0]
    if result.error:
        raise result.error
    df = result.metrics_dataframe
    heldout = df["p3o/heldout_reward_mean"].dropna()
    return df, {"heldout_before": float(heldout.iloc[0]), "heldout_after": float(heldout.iloc[-1]),
                "heldout_max": float(heldout.max()), "train_time_s": float(df["time_total_s"].iloc[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/offline")
    parser.add_argument("--record-iterations", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=150)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    traj = os.path.join(out, "trajectories")

    import ray

    import rllib_p3o  # noqa: F401  (registers "P3O")
    from rllib_p3o.progress import plot_training_curves
    from rllib_p3o.tasks import build_demo_model
    from rllib_p3o.tasks.demo import demo_config

    model = build_demo_model(os.path.join(out, "base_model"))
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    summary = {}

    print(f"[1/3] online run, recorded to {traj}", flush=True)
    _, summary["recorded_online_run"] = _tune(demo_config(model, record_rollouts=traj), "record", out,
                                              args.record_iterations)
    check = subprocess.run([sys.executable, "-m", "rllib_p3o.cli", "validate", traj, "--model", model],
                           capture_output=True, text=True)
    print("      rllib-p3o validate:", check.stdout.splitlines()[0], flush=True)
    summary["validate"] = check.stdout.splitlines()[0]

    frames = {}
    print("[2/3] fresh base model, offline-only from the recording", flush=True)
    offline = demo_config(model, offline_fraction=1.0).offline_data(input_=[traj])
    frames["offline only"], summary["offline_only"] = _tune(offline, "offline_only", out, args.iterations)

    print("[3/3] fresh base model, 50% recording + 50% online", flush=True)
    mixed = demo_config(model, offline_fraction=0.5).offline_data(input_=[traj])
    frames["50% offline + 50% online"], summary["mixed"] = _tune(mixed, "mixed", out, args.iterations)

    summary["plot"] = plot_training_curves(frames, os.path.join(out, "offline_curves.png"),
                                           title="P3O from recorded trajectories (fresh base model)")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
