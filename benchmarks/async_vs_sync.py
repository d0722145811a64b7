"""Sync vs async P3O on the demo task: time and samples to a held-out accuracy, over seeds, in one session.

    python benchmarks/async_vs_sync.py [--seeds 0 1 2] [--target 0.9] [--max-iterations 60]
                                       [--out results/benchmarks/async_vs_sync.json]

For each seed, each mode (alternating) trains the demo base model with the demo config until the greedy held-out
accuracy, evaluated at the start of every iteration, reaches ``--target``. Reported per run: training seconds to
the target (wall time minus the evaluations, which are the same work in both modes), completions trained to the
target (sample efficiency), seconds per iteration, the learner's wait for data and the runner's idle time, and
the mean staleness. The summary gives each mode's median over seeds and the ratio sync/async of the median
seconds to target (> 1: async reaches the target sooner).

Async mode gives the local learner one thread beside the runner's one (`P3OConfig.learner_threads`); sync mode
gives it both cores while the runner waits. Which wins depends on the split of an iteration: the demo (64
prompts x 8 completions of at most 3 tokens, two optimizer steps on 512 rows) is learner-heavy, so overlapping
its short generation gains little; `benchmarks/peer_trl.py`'s setting (16-token completions) overlaps more.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List, Optional

from _report import write_report


def run(mode: str, model: str, seed: int, target: float, max_iterations: int) -> Dict:
    from rllib_p3o.core import metrics
    from rllib_p3o.tasks.demo_config import demo_config

    extra = {"async_sampling": True, "max_staleness": 2} if mode == "async" else {}
    algo = demo_config(model, eval_interval=1, **extra).debugging(seed=seed).build_algo()
    train_s, rows, waits, idle, stale = 0.0, 0, [], [], []
    reached: Optional[Dict] = None
    heldout = float("nan")
    try:
        for it in range(1, max_iterations + 1):
            t = time.perf_counter()
            res = algo.train()
            p = res[metrics.P3O]
            heldout = p[metrics.HELDOUT_REWARD_MEAN]  # of the policy before this iteration's update
            if heldout >= target:
                reached = {"seconds": train_s, "completions": rows, "iterations": it - 1}
                break
            train_s += time.perf_counter() - t - p.get(metrics.TIME_EVAL_S, 0.0)
            rows += p[metrics.NUM_COMPLETIONS]
            waits.append(p.get(metrics.LEARNER_WAIT_FOR_DATA_S, p[metrics.TIME_GENERATE_S]))
            idle.append(res.get("env_runners", {}).get(metrics.IDLE_TIME_S, 0.0))
            stale.append(p.get(metrics.STALENESS_MEAN, 0.0))
    finally:
        algo.stop()
    print(
        f"{mode:5s} seed {seed}: "
        + (
            f"target after {reached['seconds']:.1f} s of training, {reached['completions']} completions"
            if reached
            else f"target not reached in {max_iterations} iterations (held-out {heldout:.3f})"
        ),
        flush=True,
    )
    n = max(1, len(waits))
    return {
        "seed": seed,
        "reached": reached,
        "final_heldout": heldout,
        "s_per_iteration": train_s / n,
        "learner_wait_for_data_s_mean": sum(waits) / n,
        "runner_idle_s_mean": sum(idle) / n,
        "staleness_mean": sum(stale) / n,
    }


def summarize(runs: List[Dict]) -> Dict:
    hit = [r["reached"] for r in runs if r["reached"]]
    med = (lambda key: statistics.median(h[key] for h in hit)) if hit else (lambda key: None)
    return {
        "reached": f"{len(hit)}/{len(runs)}",
        "median_seconds_to_target": med("seconds"),
        "median_completions_to_target": med("completions"),
        "median_s_per_iteration": statistics.median(r["s_per_iteration"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--max-iterations", type=int, default=60)
    parser.add_argument("--out", default="results/benchmarks/async_vs_sync.json")
    args = parser.parse_args()

    import ray

    from rllib_p3o.tasks import build_demo_model

    model = build_demo_model(args.model_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    runs: Dict[str, List[Dict]] = {"sync": [], "async": []}
    for seed in args.seeds:
        for mode in runs:
            runs[mode].append(run(mode, model, seed, args.target, args.max_iterations))
    report = {"target": args.target, "runs": runs, "summary": {m: summarize(r) for m, r in runs.items()}}
    s, a = (report["summary"][m]["median_seconds_to_target"] for m in ("sync", "async"))
    report["sync_over_async_seconds_to_target"] = s / a if s and a else None
    write_report(report, args.out)


if __name__ == "__main__":
    main()
