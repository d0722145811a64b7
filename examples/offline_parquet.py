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
import os
import subprocess
import sys

from _common import run_tuner, write_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/offline")
    parser.add_argument("--record-iterations", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=150)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    traj = os.path.join(out, "trajectories")

    import ray

    from rllib_p3o.driver.progress import plot_training_curves
    from rllib_p3o.tasks import build_demo_model
    from rllib_p3o.tasks.demo_config import demo_config

    model = build_demo_model(os.path.join(out, "base_model"))
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    summary = {}

    print(f"[1/3] online run, recorded to {traj}", flush=True)
    _, summary["recorded_online_run"] = run_tuner(
        demo_config(model, record_rollouts=traj), "record", out, {"training_iteration": args.record_iterations}
    )
    check = subprocess.run(
        [sys.executable, "-m", "rllib_p3o.cli", "validate", traj, "--model", model], capture_output=True, text=True
    )
    print("      rllib-p3o validate:", check.stdout.splitlines()[0], flush=True)
    summary["validate"] = check.stdout.splitlines()[0]

    frames = {}
    print("[2/3] fresh base model, offline-only from the recording", flush=True)
    offline = demo_config(model, offline_fraction=1.0).offline_data(input_=[traj])
    frames["offline only"], summary["offline_only"] = run_tuner(
        offline, "offline_only", out, {"training_iteration": args.iterations}
    )

    print("[3/3] fresh base model, 50% recording + 50% online", flush=True)
    mixed = demo_config(model, offline_fraction=0.5).offline_data(input_=[traj])
    frames["50% offline + 50% online"], summary["mixed"] = run_tuner(
        mixed, "mixed", out, {"training_iteration": args.iterations}
    )

    summary["plot"] = plot_training_curves(
        frames, os.path.join(out, "offline_curves.png"), title="P3O from recorded trajectories (fresh base model)"
    )
    write_summary(summary, out)


if __name__ == "__main__":
    main()
