"""Soak: memory of every process over a long run, sync and async, with recording and a behavior model on.

    python benchmarks/soak.py [--iterations 1000] [--every 25] [--warmup 200] [--modes sync async]
                              [--out results/benchmarks/soak.json] [--plot docs/soak.png] [--plot-only]

Each mode trains the tiny test model (arithmetic prompts, 4 prompts x 4 completions per iteration plus 2 completions
per prompt from a frozen behavior model, at most 3 new tokens, every iteration recorded as trajectory Parquet,
held-out evaluation every 25 iterations) with one vLLM runner and one remote learner, in a Ray instance of its own.
Every ``--every`` iterations it samples the resident memory (RSS, and USS: the pages no other process shares) of the
driver, each runner (with its child processes) and each learner, and the object store's use (bytes and objects).

Growth after warm-up, per process: the RSS at the last sample over the RSS at the first sample at or after
``--warmup`` iterations, minus 1. The run passes when every process's growth is at most 5% (``--max-growth``) and
the object store's peak in the second half of the samples after warm-up is at most its peak in the first half plus
1 MiB (it holds a few weight payloads at any moment); otherwise it says which and exits 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

from _report import write_report

MIB = 2**20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def object_store_use() -> Dict[str, float]:
    """Bytes and objects in Ray's object store, over all nodes (what ``ray memory --stats-only`` reports)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    stats = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats
    return {
        "object_store_mib": stats.object_store_bytes_used / MIB,
        "object_store_objects": float(stats.num_local_objects),
    }


def memory(pid: int, with_children: bool = False) -> Dict[str, float]:
    """RSS and USS of a process (and of its children, when asked), in MiB."""
    import psutil

    procs = [psutil.Process(pid)]
    if with_children:
        procs += procs[0].children(recursive=True)
    rss = uss = 0.0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss / MIB
        uss += info.uss / MIB
    return {"rss_mib": rss, "uss_mib": uss}


def config(mode: str, policy: str, behavior: str, record_dir: str):
    from rllib_p3o.tasks.scenarios import tiny_run

    extra = {"async_sampling": True, "max_staleness": 2} if mode == "async" else {}
    config = tiny_run(
        policy,
        rows=None,
        eval_rows=None,
        prompts_per_step=4,
        max_tokens=3,
        lr=1e-4,
        eval_interval=25,
        eval_max_prompts=16,
        behavior_models=[{"model": behavior, "name": "frozen", "samples": 2}],
        record_rollouts=record_dir,
        **extra,
    )
    return config.learners(num_learners=1)


def soak(mode: str, policy: str, behavior: str, iterations: int, every: int) -> Dict[str, Any]:
    import ray

    from rllib_p3o.core import metrics

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    record_dir = tempfile.mkdtemp(prefix=f"soak-{mode}-")
    algo = config(mode, policy, behavior, record_dir).build_algo()
    samples: List[Dict[str, Any]] = []
    try:
        runner_pids = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False)
        learner_pids = [r.get() for r in algo.learner_group.foreach_learner(lambda learner: os.getpid())]
        t_start = t_window = time.perf_counter()
        for it in range(1, iterations + 1):
            res = algo.train()
            if it % every and it != 1:
                continue
            now = time.perf_counter()
            sample = {
                "iteration": it,
                "s_per_iteration": (now - t_window) / (1 if it == 1 else every),
                "driver": memory(os.getpid()),
                "runners": [memory(pid, with_children=True) for pid in runner_pids],
                "learners": [memory(pid) for pid in learner_pids],
                **object_store_use(),
                "recorded_files": len(os.listdir(record_dir)),
                "reward_mean": float(res[metrics.P3O][metrics.REWARD_MEAN]),
            }
            samples.append(sample)
            t_window = now
            eta = (now - t_start) / it * (iterations - it)
            runners = " ".join(f"{r['rss_mib']:.0f}" for r in sample["runners"])
            learners = " ".join(f"{r['rss_mib']:.0f}" for r in sample["learners"])
            print(
                f"[{mode}] iteration {it}/{iterations}: {sample['s_per_iteration']:.2f} s/it, RSS MiB driver "
                f"{sample['driver']['rss_mib']:.0f}, runner {runners}, learner {learners}; object store "
                f"{sample['object_store_mib']:.1f} MiB in {sample['object_store_objects']:.0f} objects; "
                f"ETA {eta / 60:.0f} min",
                flush=True,
            )
        wall = time.perf_counter() - t_start
    finally:
        algo.stop()
        ray.shutdown()
        shutil.rmtree(record_dir, ignore_errors=True)
    return {"mode": mode, "wall_s": wall, "samples": samples}


def growth(run: Dict[str, Any], warmup: int) -> Dict[str, float]:
    """Each process's RSS growth from the first sample at or after ``warmup`` to the last; the object store's MiB."""
    after = [s for s in run["samples"] if s["iteration"] >= warmup]
    first, last = after[0], after[-1]
    out = {"from_iteration": first["iteration"], "to_iteration": last["iteration"]}
    out["driver"] = last["driver"]["rss_mib"] / first["driver"]["rss_mib"] - 1
    for kind in ("runners", "learners"):
        for i, (a, b) in enumerate(zip(first[kind], last[kind])):
            out[f"{kind[:-1]}_{i + 1}"] = b["rss_mib"] / a["rss_mib"] - 1
    # The store holds a few weight payloads (~1 MiB each here) at any moment: compare the peaks of the two halves.
    half = len(after) // 2
    out["object_store_mib_max_first_half"] = max(s["object_store_mib"] for s in after[: max(1, half)])
    out["object_store_mib_max_second_half"] = max(s["object_store_mib"] for s in after[half:])
    return out


def plot(runs: List[Dict[str, Any]], warmup: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        its = [s["iteration"] for s in run["samples"]]
        ax.plot(its, [s["driver"]["rss_mib"] for s in run["samples"]], label="driver")
        for i in range(len(run["samples"][0]["runners"])):
            ax.plot(its, [s["runners"][i]["rss_mib"] for s in run["samples"]], label=f"runner {i + 1}")
        for i in range(len(run["samples"][0]["learners"])):
            ax.plot(its, [s["learners"][i]["rss_mib"] for s in run["samples"]], label=f"learner {i + 1}")
        ax.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
        ax.set_title(f"{run['mode']}: RSS per process")
        ax.set_xlabel("iteration")
        ax.set_ylim(bottom=0)
        store = ax.twinx()
        store.plot(its, [s["object_store_mib"] for s in run["samples"]], color="black", linestyle="--", linewidth=1)
        store.set_ylabel("object store, MiB (dashed)")
        store.set_ylim(bottom=0, top=max(8.0, 2 * max(s["object_store_mib"] for s in run["samples"])))
    axes[0][0].set_ylabel("RSS, MiB")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--max-growth", type=float, default=0.05)
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    p.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "soak.json"))
    p.add_argument("--plot", default=os.path.join(os.path.dirname(__file__), "..", "docs", "soak.png"))
    p.add_argument("--plot-only", action="store_true", help="redraw the plot from --out's JSON, run nothing")
    args = p.parse_args()
    if args.plot_only:
        import json

        with open(args.out) as f:
            report = json.load(f)
        plot(report["runs"], report["warmup"], args.plot)
        return 0

    import rllib_p3o
    from rllib_p3o.tasks import build_tiny_model

    models = tempfile.mkdtemp(prefix="soak-models-")
    policy = build_tiny_model(os.path.join(models, "policy"))
    behavior = build_tiny_model(os.path.join(models, "behavior"), tie_word_embeddings=False, seed=1, init_std=0.1)
    runs = [soak(mode, policy, behavior, args.iterations, args.every) for mode in args.modes]
    shutil.rmtree(models, ignore_errors=True)

    failures = []
    for run in runs:
        run["growth"] = g = growth(run, args.warmup)
        for key, value in g.items():
            if key in ("from_iteration", "to_iteration") or key.startswith("object_store"):
                continue
            if value > args.max_growth:
                failures.append(f"{run['mode']}: {key} RSS grew {value:.1%} after warm-up")
        if g["object_store_mib_max_second_half"] > g["object_store_mib_max_first_half"] + 1.0:
            failures.append(
                f"{run['mode']}: the object store's peak grew from {g['object_store_mib_max_first_half']:.1f} to "
                f"{g['object_store_mib_max_second_half']:.1f} MiB"
            )
    plot(runs, args.warmup, args.plot)
    import psutil

    report = {
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "version": rllib_p3o.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM",
        "iterations": args.iterations,
        "every": args.every,
        "warmup": args.warmup,
        "max_growth": args.max_growth,
        "runs": runs,
        "passed": not failures,
        "failures": failures,
    }
    write_report(report, args.out)
    for run in runs:
        g = run["growth"]
        print(
            f"{run['mode']}: {run['wall_s'] / args.iterations:.2f} s/iteration; RSS growth from iteration "
            f"{g['from_iteration']} to {g['to_iteration']}: "
            + ", ".join(f"{k} {v:+.1%}" for k, v in g.items() if not k.endswith("iteration") and "object" not in k)
            + f"; object store peak {g['object_store_mib_max_first_half']:.1f} -> "
            f"{g['object_store_mib_max_second_half']:.1f} MiB (first and second half after warm-up)"
        )
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print(f"passed: no process grew more than {args.max_growth:.0%} after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
