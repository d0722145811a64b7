"""How robust is `make demo`? The demo over base-model seeds x RL seeds x torch thread counts, one run after another.

    python benchmarks/demo_seeds.py [--base-seeds 0 1 2 3 4] [--rl-seeds 0 1] [--threads 1 2] [--time-limit 600]

Each run is ``examples/demo.py`` itself, in a subprocess, with its own base model (built with that seed and that
many torch threads: the thread count changes the pretraining's floats) under OUT/b<base>_s<rl>_t<threads>/.
Prints one line per run (held-out before/after, time and iterations to the target) and the success count; writes
results/benchmarks/demo_seeds.json and docs/demo_seeds.png (held-out accuracy against iterations, every run).
A run that misses the target makes this command exit with status 1. The report is rewritten after every run, and
a rerun skips the runs it already holds (``--fresh`` starts over), so an interrupted table can be completed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

from _report import run_example

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_demo(out: str, base_seed: int, rl_seed: int, threads: int, target: float, time_limit: float) -> dict:
    summary = run_example(
        "demo.py",
        out,
        [
            "--base-seed",
            str(base_seed),
            "--seed",
            str(rl_seed),
            "--threads",
            str(threads),
            "--target",
            str(target),
            "--time-limit",
            str(time_limit),
        ],
        "demo.log",
    )
    if "error" in summary:
        return {**summary, "target_reached": False}
    # The curve rides in the report, so that the plot can be redrawn (and the table resumed) without OUT.
    summary["heldout_curve"] = heldout_curve(os.path.join(out, "metrics.csv"))
    return summary


def heldout_curve(metrics_csv: str) -> list:
    """[[iteration, held-out accuracy], ...] from a demo run's metrics.csv."""
    import pandas as pd

    from rllib_p3o.core import metrics

    columns = ["training_iteration", metrics.column(metrics.P3O, metrics.HELDOUT_REWARD_MEAN)]
    return pd.read_csv(metrics_csv)[columns].dropna().values.tolist()


def threads_change_nothing(runs: list) -> bool:
    """True if every (base seed, RL seed) ran with several thread counts and all of them gave the same curve."""
    curves: dict = {}
    for run in runs:
        curves.setdefault((run["base_seed"], run["rl_seed"]), []).append(run.get("heldout_curve"))
    return all(len(c) > 1 and all(x == c[0] for x in c) for c in curves.values())


def plot(runs: list, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        if run.get("heldout_curve"):
            iterations, heldout = zip(*run["heldout_curve"])
            ax.plot(iterations, heldout, alpha=0.7, lw=1, color="tab:blue" if run["threads"] == 1 else "tab:orange")
    for threads, color in ((1, "tab:blue"), (2, "tab:orange")):  # a legend entry only for thread counts run
        if any(run["threads"] == threads for run in runs):
            ax.plot([], [], color=color, label=f"pretrained with {threads} thread{'s' if threads > 1 else ''}")
    ax.axhline(runs[0]["target"], color="gray", ls="--", lw=1)
    ax.set_xlabel("iteration (512 completions each)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    n_ok = sum(r["target_reached"] for r in runs)
    title = f"make demo over {len(runs)} runs (base seed x RL seed x threads): {n_ok} reached the target"
    if threads_change_nothing(runs):
        title += "\n(each 1-thread curve lies exactly on its 2-thread twin: the thread count changed no result)"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--rl-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--out", default="runs/demo_seeds")
    parser.add_argument("--report", default=os.path.join(ROOT, "results", "benchmarks", "demo_seeds.json"))
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "demo_seeds.png"))
    parser.add_argument("--fresh", action="store_true", help="ignore runs already in the report")
    parser.add_argument("--report-only", action="store_true", help="start no run: redraw the report from those held")
    args = parser.parse_args()
    done = {}
    if os.path.exists(args.report) and not args.fresh:
        with open(args.report) as f:
            done = {(r["threads"], r["base_seed"], r["rl_seed"]): r for r in json.load(f).get("runs", [])}

    grid = list(itertools.product(args.threads, args.base_seeds, args.rl_seeds))
    print(
        f"{len(grid)} demo runs, one after another (each: base model build + Ray start-up + training)\n"
        f"{'threads':>7} {'base':>4} {'rl':>3} | {'held-out before':>15} {'after':>6} | {'to target':>9} "
        f"{'iters':>5} | {'wall':>5}",
        flush=True,
    )
    runs = []
    for threads, base_seed, rl_seed in grid:
        if (threads, base_seed, rl_seed) in done:
            run = done[(threads, base_seed, rl_seed)]
            csv = os.path.join(run.get("out", ""), "metrics.csv")
            if "heldout_curve" not in run and os.path.exists(csv):
                run["heldout_curve"] = heldout_curve(csv)
        elif args.report_only:
            continue
        else:
            out = os.path.abspath(os.path.join(args.out, f"b{base_seed}_s{rl_seed}_t{threads}"))
            os.makedirs(out, exist_ok=True)
            run = run_demo(out, base_seed, rl_seed, threads, args.target, args.time_limit)
            run.update(out=out, base_seed=base_seed, rl_seed=rl_seed, threads=threads, target=args.target)
        runs.append(run)
        write_report(runs, args)
        if "error" in run:
            print(f"{threads:>7} {base_seed:>4} {rl_seed:>3} | FAILED: {run['error']}", flush=True)
            continue
        to_target = f"{run['seconds_to_target']:.0f}s" if run["target_reached"] else "missed"
        iters = run["iterations_to_target"] if run["target_reached"] else run["iterations"]
        print(
            f"{threads:>7} {base_seed:>4} {rl_seed:>3} | {run['heldout_before']:>15.3f} "
            f"{run['heldout_after']:>6.3f} | {to_target:>9} {iters:>5} | {run['wall_time_s']:>4.0f}s",
            flush=True,
        )

    report = write_report(runs, args)
    print(
        f"{report['num_reached']} of {len(runs)} runs reached held-out >= {args.target} within "
        f"{args.time_limit:.0f}s; time to target {report['seconds_to_target']}, iterations "
        f"{report['iterations_to_target']}\nreport {os.path.relpath(args.report)}, plot {os.path.relpath(args.plot)}",
        flush=True,
    )
    return 0 if report["num_reached"] == len(runs) == len(grid) else 1


def write_report(runs: list, args) -> dict:
    """The table so far (runs, success count, spread of the time to target) as JSON, and its plot."""
    reached = [r for r in runs if r["target_reached"]]
    secs = sorted(r["seconds_to_target"] for r in reached)
    iters = sorted(r["iterations_to_target"] for r in reached)
    report = {
        "runs": runs,
        "num_runs": len(runs),
        "num_reached": len(reached),
        "target": args.target,
        "time_limit_s": args.time_limit,
        "seconds_to_target": {"min": secs[0], "median": secs[len(secs) // 2], "max": secs[-1]} if secs else None,
        "iterations_to_target": {"min": iters[0], "median": iters[len(iters) // 2], "max": iters[-1]}
        if iters
        else None,
        "plot": os.path.relpath(plot(runs, args.plot), ROOT),
    }
    os.makedirs(os.path.dirname(args.report), exist_ok=True)
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    sys.exit(main())
