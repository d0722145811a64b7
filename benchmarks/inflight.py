"""Sync, async at chunk boundaries and in-flight weight updates, side by side in one session: throughput and the
learner's idle share with completions of spread lengths.

    python benchmarks/inflight.py [--caps 128 512] [--size 2.44M] [--steps 12] [--repeats 2]
                                  [--modes sync async inflight inflight_keep] [--out results/benchmarks/inflight.json]

The setting of `peer_trl.py` (the task "A+B=", 8 prompts x 8 completions per step, one runner, a local learner)
with the spread-length model of `_spread_model.py`: completions end at geometric lengths of mean ``cap / 2`` up to
``cap`` tokens, so a chunk's longest completion runs far past its typical one. Modes, each a fresh algorithm:
``sync`` (generate, then train), ``async`` (the runner generates the next chunk while the learner trains; weights
load between two chunks), ``inflight`` (``inflight_weight_updates=True``, recomputed prefix KV) and
``inflight_keep`` (the prefix KV kept). The modes alternate within each repeat; after ``WARMUP_STEPS`` steps each
runs ``--steps`` steps. Reported per mode (median over its steps, pooled over repeats): trained completion tokens per
second of wall time, the learner's idle share (its wait for data over the wall time; in sync mode the generation
time, when the learner has nothing to do), the runner's idle share, the mean staleness and the share of completions
that span weight versions. Ratios: in-flight over async throughput.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Dict, List

from _bench_settings import GROUP_SIZE, LR, PROMPTS_PER_STEP, sum_reward, task_rows
from _report import write_report
from _spread_model import build_spread_model

WARMUP_STEPS = 3
MODES = {
    "sync": {},
    "async": {"async_sampling": True, "max_staleness": 4},
    "inflight": {"async_sampling": True, "max_staleness": 4, "inflight_weight_updates": True},
    "inflight_keep": {
        "async_sampling": True,
        "max_staleness": 4,
        "inflight_weight_updates": True,
        "inflight_kv_cache": "keep",
    },
}


def run(model: str, mode: str, cap: int, steps: int) -> Dict:
    """One algorithm of ``mode``: its steps' wall time, trained tokens, learner and runner waits."""
    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics

    config = (
        P3OConfig()
        .environment(env_config={"dataset": task_rows(), "reward_fn": sum_reward})
        .training(
            model=model,
            group_size=GROUP_SIZE,
            prompts_per_step=PROMPTS_PER_STEP,
            max_tokens=cap,
            lr=LR,
            eval_interval=0,
            **MODES[mode],
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    out: Dict[str, List[float]] = {
        k: [] for k in ("wall_s", "tokens", "learner_idle_s", "runner_idle_s", "stale", "spanning")
    }
    # The machine's other work during this run (one-minute load average; the benchmark itself adds about 2).
    out["load_average_before"] = [os.getloadavg()[0]]
    try:
        for i in range(WARMUP_STEPS + steps):
            t = time.perf_counter()
            res = algo.train()
            wall = time.perf_counter() - t
            if i < WARMUP_STEPS:
                continue
            p = res[metrics.P3O]
            out["wall_s"].append(wall)
            out["tokens"].append(p[metrics.TRAINED_TOKENS])
            waited = p.get(metrics.LEARNER_WAIT_FOR_DATA_S)
            out["learner_idle_s"].append(p[metrics.TIME_GENERATE_S] if waited is None else waited)
            out["runner_idle_s"].append(res.get("env_runners", {}).get(metrics.IDLE_TIME_S, 0.0))
            out["stale"].append(p.get(metrics.STALENESS_MEAN, 0.0))
            out["spanning"].append(p.get(metrics.SPANNING_VERSIONS_SHARE, 0.0))
    finally:
        algo.stop()
    return out


def summarize(runs: List[Dict]) -> Dict:
    wall = [w for r in runs for w in r["wall_s"]]
    tokens = [t for r in runs for t in r["tokens"]]
    learner = [x for r in runs for x in r["learner_idle_s"]]
    runner = [x for r in runs for x in r["runner_idle_s"]]
    return {
        "steps": len(wall),
        "tokens_per_s": sum(tokens) / sum(wall),
        "s_per_step_median": statistics.median(wall),
        "learner_idle_share": sum(learner) / sum(wall),
        "runner_idle_share": sum(runner) / sum(wall),
        "staleness_mean": statistics.mean(x for r in runs for x in r["stale"]),
        "spanning_share": statistics.mean(x for r in runs for x in r["spanning"]),
        "load_average_before_max": max(x for r in runs for x in r.get("load_average_before", [0.0])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caps", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--size", default="2.44M")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--models-dir", default="runs/inflight")
    parser.add_argument("--out", default="results/benchmarks/inflight.json")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    report: Dict = {
        "size": args.size,
        "steps": args.steps,
        "warmup_steps": WARMUP_STEPS,
        "repeats": args.repeats,
        "caps": {},
    }
    for cap in args.caps:
        model = build_spread_model(
            os.path.join(args.models_dir, f"{args.size}_cap{cap}"), args.size, mean_tokens=cap / 2,
            max_position_embeddings=max(1024, cap + 64),
        )  # fmt: skip
        runs: Dict[str, List[Dict]] = {m: [] for m in args.modes}
        for repeat in range(args.repeats):
            for mode in args.modes:
                result = run(model, mode, cap, args.steps)
                runs[mode].append(result)
                print(f"cap {cap} repeat {repeat} {mode}: {summarize([result])}", flush=True)
        summary = {m: summarize(r) for m, r in runs.items()}
        ratios = {}
        if "async" in summary:
            for m in ("inflight", "inflight_keep", "sync"):
                if m in summary:
                    ratios[f"{m}_over_async_tokens_per_s"] = (
                        summary[m]["tokens_per_s"] / summary["async"]["tokens_per_s"]
                    )
        report["caps"][str(cap)] = {"runs": runs, "summary": summary, "ratios": ratios}
        print(f"cap {cap}: {summary}\n{ratios}", flush=True)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
