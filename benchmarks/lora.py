"""Full fine-tuning vs LoRA: weight-sync seconds and bytes, learner memory and step time at a ~10M model, and
learning on the demo task.

    python benchmarks/lora.py [--sizes 10M 2.44M] [--iterations 8] [--rank 16] [--learning-seeds 0 1]
                              [--out results/benchmarks/lora.json]

Part 1, per model size (randomly initialized Qwen2s of `_bench_settings.SIZES`, the "A+B=" task of `peer_trl.py`'s
setting, `_bench_settings`: 8 prompts x 8 completions, 16 new tokens): each mode runs in its own process (1 vLLM runner, local learner, sync sampling) for
N iterations; reported are medians over the iterations after the first of the weight sync (seconds on the
iteration's path, bytes, and its split: gather on the driver, transfer, engine load), the iteration and the learner
update, plus the learner's tensor memory (parameters, gradients, optimizer state) and the driver process's peak RSS
(the local learner lives there). Alternating modes, ``--repeats`` times. Every sync is probe-checked (riding along,
`rllib_p3o.sync.probe`); what that costs is measured by `probe_cost.py`.
Part 2 runs ``examples/demo.py`` (through tune.Tuner, to held-out accuracy 0.9) with full weights and with
``--lora RANK`` for each ``--learning-seeds`` seed, and reports what each reached and when.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

from _bench_settings import GROUP_SIZE, MAX_TOKENS, PROMPTS_PER_STEP, SIZES, build_model, sum_reward, task_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LR_FULL, LR_LORA = 1e-4, 1e-3  # LoRA's usual ~10x
DEMO_LR_FULL, DEMO_LR_LORA = None, 2e-3  # the demo's own peak (5e-4) for full weights


def _tensor_bytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def run_mode(model: str, mode: str, iterations: int, rank: int) -> Dict:
    """One process, one mode: the figures of Part 1."""
    import ray
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics as m

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    lora = {"r": rank, "alpha": 2 * rank} if mode == "lora" else None
    config = (
        P3OConfig()
        .environment(env_config={"dataset": task_rows(), "reward_fn": sum_reward})
        .training(
            model=model,
            group_size=GROUP_SIZE,
            prompts_per_step=PROMPTS_PER_STEP,
            max_tokens=MAX_TOKENS,
            lr=LR_LORA if lora else LR_FULL,
            eval_interval=0,
            lora=lora,
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    rows = []
    for _ in range(iterations):
        res = algo.train()
        p = res[m.P3O]
        rows.append(
            {
                "iteration_s": res["time_this_iter_s"],
                "generate_s": p[m.TIME_GENERATE_S],
                "train_s": p[m.TIME_TRAIN_S],
                "sync_s": p[m.TIME_SYNC_S],
                "sync_bytes": p[m.SYNC_PREFIX + m.SYNC_BYTES],
                **{k: p[m.SYNC_PREFIX + k] for k in (m.GATHER_S, m.PROBE_LEARNER_S, m.TRANSFER_S, m.ENGINE_RELOAD_S)},
                "probe_max_abs_diff": p[m.SYNC_PROBE_MAX_ABS_DIFF],
            }
        )
    learner = algo.learner_group._learner
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    params = list(module.parameters())
    optim_state = [
        t
        for opt in learner._named_optimizers.values()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    ]
    algo.stop()
    later = rows[1:] or rows
    return {
        **{k: statistics.median(r[k] for r in later) for k in later[0]},
        "max_probe_abs_diff": max(r["probe_max_abs_diff"] for r in rows),
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "param_bytes": _tensor_bytes(params),
        "grad_bytes": _tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": _tensor_bytes(optim_state),
        "driver_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _child(model: str, mode: str, iterations: int, rank: int) -> Dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--model",
                model,
                "--iterations",
                str(iterations),
                "--rank",
                str(rank),
                "--child-out",
                f.name,
            ],
            check=True,
            cwd=ROOT,
        )
        return json.load(open(f.name))


def _demo(seed: int, rank: int, out_dir: str) -> Dict:
    """examples/demo.py with full weights (rank 0) or LoRA; its summary, whether or not it reached the target."""
    args = [sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--out", out_dir, "--seed", str(seed)]
    if rank:
        args += ["--lora", str(rank), "--lr", str(DEMO_LR_LORA)]
    subprocess.run(args, cwd=ROOT)
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    keys = (
        "target_reached",
        "heldout_before",
        "heldout_after",
        "heldout_max",
        "seconds_to_target",
        "iterations_to_target",
        "train_time_s",
        "iterations",
    )
    return {k: summary.get(k) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M"], choices=list(SIZES))
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--learning-seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "runs", "bench_models"))
    parser.add_argument("--runs-dir", default=os.path.join(ROOT, "runs", "lora"))
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "lora.json"))
    parser.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        json.dump(run_mode(args.model, args.child, args.iterations, args.rank), open(args.child_out, "w"))
        return

    report: Dict = {
        "rank": args.rank,
        "alpha": 2 * args.rank,
        "iterations": args.iterations,
        "sizes": {},
        "learning": {},
    }
    for size in args.sizes:
        model = build_model(size, args.models_dir)
        runs: Dict[str, List[Dict]] = {"full": [], "lora": []}
        for r in range(args.repeats):
            for mode in ("full", "lora") if r % 2 == 0 else ("lora", "full"):
                print(f"[lora bench] {size} {mode} (repeat {r + 1}/{args.repeats})", flush=True)
                runs[mode].append(_child(model, mode, args.iterations, args.rank))
        best = {mode: min(rs, key=lambda x: x["iteration_s"]) for mode, rs in runs.items()}
        full, lora = best["full"], best["lora"]
        report["sizes"][size] = {
            **best,
            "adapter_to_model_params": lora["trainable_params"] / full["params"],
            "sync_bytes_ratio": lora["sync_bytes"] / full["sync_bytes"],
            "sync_s_ratio": lora["sync_s"] / full["sync_s"],
            "sync_share_of_iteration": {mode: best[mode]["sync_s"] / best[mode]["iteration_s"] for mode in best},
            "learner_tensor_bytes_ratio": sum(lora[k] for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes"))
            / sum(full[k] for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")),
            "iteration_s_ratio": lora["iteration_s"] / full["iteration_s"],
        }
    for seed in args.learning_seeds:
        for mode, rank in (("full", 0), ("lora", args.rank)):
            print(f"[lora bench] demo task, {mode}, seed {seed}", flush=True)
            report["learning"][f"{mode}_seed{seed}"] = _demo(
                seed, rank, os.path.join(args.runs_dir, f"{mode}_seed{seed}")
            )
    from _report import write_report

    write_report(report, args.out)
    print(markdown(report))


def markdown(report: Dict) -> str:
    """The report as the README's tables."""
    ms = lambda x: f"{1000 * x:.1f} ms"  # noqa: E731
    mb = lambda x: f"{x / 2**20:.1f} MB"  # noqa: E731
    lines = []
    for size, r in report["sizes"].items():
        full, lora = r["full"], r["lora"]
        rows = [
            ("trainable parameters", f"{full['trainable_params']:,}", f"{lora['trainable_params']:,}"),
            ("bytes per sync", mb(full["sync_bytes"]), mb(lora["sync_bytes"])),
            *[
                (f"sync: {k.replace('_s', '').replace('_', ' ')}", ms(full[k]), ms(lora[k]))
                for k in ("gather_s", "transfer_s", "engine_reload_s")
            ],
            (
                "sync, whole (share of iteration)",
                f"{ms(full['sync_s'])} ({r['sync_share_of_iteration']['full']:.1%})",
                f"{ms(lora['sync_s'])} ({r['sync_share_of_iteration']['lora']:.1%})",
            ),
            ("learner probe (background, beside generation)", ms(full["probe_learner_s"]), ms(lora["probe_learner_s"])),
            ("probe max abs diff", f"{full['max_probe_abs_diff']:.1e}", f"{lora['max_probe_abs_diff']:.1e}"),
            (
                "learner tensors (params + grads + Adam)",
                mb(full["param_bytes"] + full["grad_bytes"] + full["optimizer_state_bytes"]),
                mb(lora["param_bytes"] + lora["grad_bytes"] + lora["optimizer_state_bytes"]),
            ),
            ("driver peak RSS (local learner)", mb(full["driver_peak_rss_bytes"]), mb(lora["driver_peak_rss_bytes"])),
            ("generate", f"{full['generate_s']:.3f} s", f"{lora['generate_s']:.3f} s"),
            ("learner update", f"{full['train_s']:.3f} s", f"{lora['train_s']:.3f} s"),
            ("iteration", f"{full['iteration_s']:.3f} s", f"{lora['iteration_s']:.3f} s"),
        ]
        lines += [f"| {size} | full | LoRA r={report['rank']} |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        lines += [
            "",
            f"adapter/model parameters {r['adapter_to_model_params']:.4f}; sync bytes ratio "
            f"{r['sync_bytes_ratio']:.4f}; sync seconds ratio {r['sync_s_ratio']:.2f}; learner tensor "
            f"bytes ratio {r['learner_tensor_bytes_ratio']:.2f}; iteration ratio {r['iteration_s_ratio']:.2f}",
            "",
        ]
    if report["learning"]:
        lines += [
            "| demo run | reached 0.9 | held-out before → after | iterations | training s |",
            "|---|---|---|---|---|",
        ]
        for name, x in report["learning"].items():
            lines.append(
                f"| {name} | {'yes' if x['target_reached'] else 'NO'} | {x['heldout_before']:.2f} → "
                f"{x['heldout_after']:.2f} | {x['iterations']} | {x['train_time_s']:.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
