"""What the weight-sync probe check costs: riding along (the default) vs checked at load vs no check, in one process.

    python benchmarks/probe_cost.py [--sizes 2.44M 10M] [--modes full lora] [--blocks 6] [--per-block 3]
                                    [--out results/benchmarks/probe_cost.json]

Setting: the "A+B=" task of `peer_trl.py`'s setting (`_bench_settings`: 8 prompts x 8 completions, 16 new tokens),
randomly initialized Qwen2s of `_bench_settings.SIZES`, 1 vLLM runner, a local learner, sync sampling. One process per size and mode (full weights or LoRA
r=16); in it, after 2 warm-up iterations, blocks of ``--per-block`` iterations alternate between the variants (the
order reversed every other block), so the machine's drift hits all of them alike:

- ``riding_along``: the default (`rllib_p3o.sync.probe`): the engine scores the probe with its next generate call and the
  learner's probe runs in a background thread beside it;
- ``at_load``: every sync checked at load, as `WeightSync.push_verified` does (the learner's probe before the push,
  the engine's in a call of its own after the reload); this was every iteration's check before riding along;
- ``off``: no check (the benchmark switches the check off in place; weights pushed meanwhile count as checked when it
  is switched back on).

Reported: medians of the iteration (``time_this_iter_s``), generation, update and sync (the driver's push) seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

from _bench_settings import GROUP_SIZE, MAX_TOKENS, PROMPTS_PER_STEP, SIZES, build_model, sum_reward, task_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = ("riding_along", "at_load", "off")
RANK = 16


def run(model: str, mode: str, blocks: int, per_block: int) -> Dict[str, Dict[str, float]]:
    """One process: the variants' medians (seconds)."""
    import ray

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics as m

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    lora = {"r": RANK, "alpha": 2 * RANK} if mode == "lora" else None
    config = (
        P3OConfig()
        .environment(env_config={"dataset": task_rows(), "reward_fn": sum_reward})
        .training(
            model=model,
            group_size=GROUP_SIZE,
            prompts_per_step=PROMPTS_PER_STEP,
            max_tokens=MAX_TOKENS,
            lr=1e-3 if lora else 1e-4,
            eval_interval=0,
            lora=lora,
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    sync = algo._weight_sync
    probes, riding_push = sync.probes, sync.push

    def use(variant: str) -> None:
        sync.probes = None if variant == "off" else probes
        sync.push = sync.push_verified if variant == "at_load" else riding_push
        for runner_id in algo._runners.healthy_ids():  # weights pushed while off count as checked
            probes.mark_verified(runner_id, sync.weights_seq_no)

    for _ in range(2):
        algo.train()
    rows: Dict[str, List[Dict[str, float]]] = {v: [] for v in VARIANTS}
    for block in range(blocks):
        for variant in VARIANTS if block % 2 == 0 else VARIANTS[::-1]:
            use(variant)
            for _ in range(per_block):
                res = algo.train()
                p = res[m.P3O]
                rows[variant].append(
                    {
                        "iteration_s": res["time_this_iter_s"],
                        "generate_s": p[m.TIME_GENERATE_S],
                        "train_s": p[m.TIME_TRAIN_S],
                        "sync_s": p[m.TIME_SYNC_S],
                    }
                )
    use("riding_along")
    algo.stop()
    return {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["2.44M", "10M"], choices=list(SIZES))
    parser.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--per-block", type=int, default=3)
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "runs", "bench_models"))
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "probe_cost.json"))
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        json.dump(run(args.child[0], args.child[1], args.blocks, args.per_block), open(args.child_out, "w"))
        return

    report: Dict = {"blocks": args.blocks, "per_block": args.per_block, "lora_rank": RANK, "results": {}}
    for size in args.sizes:
        model = build_model(size, args.models_dir)
        for mode in args.modes:
            print(f"[probe cost] {size} {mode}", flush=True)
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        model,
                        mode,
                        "--blocks",
                        str(args.blocks),
                        "--per-block",
                        str(args.per_block),
                        "--child-out",
                        f.name,
                    ],
                    check=True,
                    cwd=ROOT,
                )
                report["results"][f"{size} {mode}"] = json.load(open(f.name))
    from _report import write_report

    write_report(report, args.out)
    print(markdown(report))


def markdown(report: Dict) -> str:
    """The report as the README's table (milliseconds)."""
    lines = [
        "| setting | check | iteration | generate | update | sync (driver's push) | sync share |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, variants in report["results"].items():
        for variant, x in variants.items():
            lines.append(
                f"| {name} | {variant.replace('_', ' ')} | {1000 * x['iteration_s']:.0f} | "
                f"{1000 * x['generate_s']:.0f} | {1000 * x['train_s']:.0f} | {1000 * x['sync_s']:.1f} | "
                f"{x['sync_s'] / x['iteration_s']:.1%} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
