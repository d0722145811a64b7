"""Sync vs async P3O on the demo task: throughput and time to held-out accuracy, in one run.

    python benchmarks/async_vs_sync.py [--target 0.9] [--time-limit 600] [--out benchmarks/results/async_vs_sync.json]

Each mode trains the demo base model (same config, same seed) until held-out accuracy reaches --target or
--time-limit seconds pass. It reports trained completions/s, seconds per iteration, learner wait for data,
staleness, and seconds and iterations to the target. On 2 CPU cores generation and learning share the same cores,
so async mode mostly removes the learner's wait for the slowest runner; it cannot run them truly in parallel.
"""

from __future__ import annotations

import argparse
import time

from _report import write_report


def run(mode: str, model: str, target: float, time_limit: float) -> dict:
    from rllib_p3o import metrics
    from rllib_p3o.tasks.demo_config import demo_config

    extra = {"async_sampling": True, "max_staleness": 2} if mode == "async" else {}
    algo = demo_config(model, **extra).build_algo()
    t0 = time.perf_counter()
    rows, it, reached, heldout, waits, stale = 0, 0, None, float("nan"), [], []
    try:
        while time.perf_counter() - t0 < time_limit:
            res = algo.train()
            it += 1
            p = res[metrics.P3O]
            rows += p[metrics.NUM_COMPLETIONS]
            waits.append(p.get(metrics.LEARNER_WAIT_FOR_DATA_S, p[metrics.TIME_GENERATE_S]))
            stale.append(p.get(metrics.STALENESS_MEAN, 0.0))
            h = p.get(metrics.HELDOUT_REWARD_MEAN, float("nan"))
            if h == h:
                heldout = h
                print(f"{mode:5s} iter {it:4d}  {time.perf_counter() - t0:6.1f}s  heldout {h:.3f}", flush=True)
                if h >= target:
                    reached = time.perf_counter() - t0
                    break
    finally:
        algo.stop()
    wall = time.perf_counter() - t0
    return {"iterations": it, "wall_s": wall, "completions_per_s": rows / wall, "s_per_iteration": wall / it,
            "learner_wait_for_data_s_mean": sum(waits) / len(waits), "staleness_mean": sum(stale) / len(stale),
            "final_heldout": heldout, "seconds_to_target": reached, "iterations_to_target": it if reached else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--out", default="benchmarks/results/async_vs_sync.json")
    args = parser.parse_args()

    import ray

    from rllib_p3o.tasks import build_demo_model

    model = build_demo_model(args.model_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    report = {mode: run(mode, model, args.target, args.time_limit) for mode in ("sync", "async")}
    report["async_over_sync_throughput"] = report["async"]["completions_per_s"] / report["sync"]["completions_per_s"]
    write_report(report, args.out)


if __name__ == "__main__":
    main()
