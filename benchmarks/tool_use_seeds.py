"""How robust is the tool-use example? `examples/tool_use.py` over base-model seeds x RL seeds, one run after another.

    python benchmarks/tool_use_seeds.py [--base-seeds 0 1] [--rl-seeds 0 1 2] [--time-limit 600]

Each base seed's model is built once (OUT/base_<seed>) and shared by its RL seeds; each run is the example itself,
in a subprocess, under OUT/b<base>_s<rl>/. Prints one line per run and the success count; writes
results/benchmarks/tool_use_seeds.json. A run that fails (the run with the calculator misses the target, or the
run without it reaches it) makes this command exit with status 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

from _report import run_example

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tool_use(out: str, base_model: str, base_seed: int, rl_seed: int, target: float, time_limit: float) -> dict:
    summary = run_example(
        "tool_use.py",
        out,
        [
            "--base-model",
            base_model,
            "--base-seed",
            str(base_seed),
            "--seed",
            str(rl_seed),
            "--target",
            str(target),
            "--time-limit",
            str(time_limit),
        ],
        "tool_use.log",
    )
    return {**summary, "success": False} if "error" in summary else summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rl-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--out", default="runs/tool_use_seeds")
    parser.add_argument("--report", default=os.path.join(ROOT, "results", "benchmarks", "tool_use_seeds.json"))
    args = parser.parse_args()
    out = os.path.abspath(args.out)

    from rllib_p3o.driver.progress import silence_driver_and_workers
    from rllib_p3o.tasks.products import build_tool_model

    silence_driver_and_workers()

    print(
        f"{len(args.base_seeds) * len(args.rl_seeds)} tool-use runs (with the calculator to {args.target}, then "
        f"without it for 3x the iterations)\n{'base':>4} {'rl':>3} | {'with: before':>12} {'after':>6} "
        f"{'iters':>5} {'train s':>7} | {'without: best':>13} {'iters':>5} | {'wall s':>6}",
        flush=True,
    )
    runs = []
    for base_seed, rl_seed in itertools.product(args.base_seeds, args.rl_seeds):
        base_model = build_tool_model(os.path.join(out, f"base_{base_seed}"), seed=base_seed)
        run = run_tool_use(
            os.path.join(out, f"b{base_seed}_s{rl_seed}"), base_model, base_seed, rl_seed, args.target, args.time_limit
        )
        run.update(base_seed=base_seed, rl_seed=rl_seed)
        runs.append(run)
        if "error" in run:
            print(f"{base_seed:>4} {rl_seed:>3} | FAILED: {run['error']}", flush=True)
            continue
        w, wo = run["with_tool"], run["without_tool"]
        print(
            f"{base_seed:>4} {rl_seed:>3} | {w['heldout_before']:>12.3f} {w['heldout_after']:>6.3f} "
            f"{w['iterations']:>5} {w['train_time_s']:>7.1f} | {wo['heldout_max']:>13.3f} {wo['iterations']:>5} | "
            f"{run['wall_time_s']:>6.0f}",
            flush=True,
        )

    ok = [r for r in runs if r.get("success")]
    done = [r for r in runs if "error" not in r]

    def spread(values: list) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}

    report = {
        "command": "python benchmarks/tool_use_seeds.py " + " ".join(sys.argv[1:]),
        "runs": runs,
        "successes": len(ok),
        "total": len(runs),
        "with_tool_heldout_before": spread([r["with_tool"]["heldout_before"] for r in done]),
        "with_tool_heldout_after": spread([r["with_tool"]["heldout_after"] for r in done]),
        "with_tool_iterations": spread([r["with_tool"]["iterations"] for r in done]),
        "with_tool_train_s": spread([r["with_tool"]["train_time_s"] for r in done]),
        "without_tool_heldout_best": spread([r["without_tool"]["heldout_max"] for r in done]),
        "wall_time_s": spread([r["wall_time_s"] for r in done]),
    }
    os.makedirs(os.path.dirname(args.report), exist_ok=True)
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    print(f"{len(ok)}/{len(runs)} runs succeeded; report {os.path.relpath(args.report)}", flush=True)
    return 0 if len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
