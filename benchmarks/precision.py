"""Rollout precision on the demo task: fp32, bf16 and simulated-FP8 rollouts, measured side by side.

    python benchmarks/precision.py [--seeds 0 1 2] [--iterations 30] [--out results/benchmarks/precision.json]
                                   [--plot docs/precision_curves.png]

Three settings, each trained on the demo setting (64 prompts x 8 completions per iteration, the demo's base model,
1 vLLM runner, local learner) for a fixed budget of ``--iterations`` iterations per seed:

    fp32           learner precision "fp32",       engine float32
    bf16           learner precision "bf16-mixed", engine bfloat16               (production's default pairing)
    fp8_simulated  learner precision "bf16-mixed", engine bfloat16, linear weights rounded through float8_e4m3fn

Per setting it reports, as the median over every iteration of every seed: the training-inference mismatch on fresh
samples (``mismatch_kl``, ``mismatch_prob_abs_diff``, ``mismatch_ess``), the probe check's largest difference, the
bytes and seconds of a weight sync, generated tokens/s and the learner's update time; and, per seed, greedy held-out
accuracy before training and at the budget (mean ± std over seeds). It prints a table, writes JSON and plots the
held-out curves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Dict, List

from _report import write_report

SETTINGS: Dict[str, Dict[str, object]] = {
    "fp32": dict(precision="fp32", rollout_dtype="float32"),
    "bf16": dict(precision="bf16-mixed", rollout_dtype="bfloat16"),
    "fp8_simulated": dict(precision="bf16-mixed", rollout_dtype="bfloat16", rollout_quantization="fp8_simulated"),
}


def _median(rows: List[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run(name: str, model: str, seed: int, iterations: int, eval_every: int) -> dict:
    from rllib_p3o.core import metrics as m
    from rllib_p3o.tasks.demo_config import demo_config

    config = demo_config(model, eval_interval=eval_every, **SETTINGS[name]).debugging(seed=seed)
    algo = config.build_algo()
    rows, heldout = [], []
    t0 = time.perf_counter()
    try:
        for i in range(iterations):
            result = algo.train()
            p3o, learner = result[m.P3O], result[m.LEARNER[0]][m.LEARNER[1]]
            if i == 0 or (i + 1) % eval_every == 0:  # evaluated before this iteration trained (i: iterations done)
                heldout.append((i, p3o[m.HELDOUT_REWARD_MEAN]))
            rows.append(
                {
                    "mismatch_kl": learner[m.MISMATCH_KL],
                    "mismatch_prob_abs_diff": learner[m.MISMATCH_PROB_ABS_DIFF],
                    "mismatch_ess": learner[m.MISMATCH_ESS],
                    "probe_max_abs_diff": p3o[m.SYNC_PROBE_MAX_ABS_DIFF],
                    "sync_bytes": p3o[m.SYNC_PREFIX + m.SYNC_BYTES],
                    "sync_s": p3o[m.TIME_SYNC_S],
                    "generated_tokens_per_s": p3o[m.GENERATED_TOKENS_PER_S],
                    "learner_update_s": p3o[m.TIME_TRAIN_S],
                    "ess": learner[m.ESS],
                }
            )
        final = algo.evaluate_heldout()[m.REWARD_MEAN]  # the verifier's reward is 1 for a right answer
        heldout.append((iterations, final))
    finally:
        algo.stop()
    print(
        f"{name:14s} seed {seed}: held-out {heldout[0][1]:.3f} -> {final:.3f}  mismatch_kl "
        f"{_median(rows, 'mismatch_kl'):.2e}  probe {_median(rows, 'probe_max_abs_diff'):.2e}  "
        f"{time.perf_counter() - t0:.0f}s",
        flush=True,
    )
    return {"seed": seed, "rows": rows, "heldout": heldout, "heldout_final": final}


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, setting in report["settings"].items():
        curves = [run["heldout"] for run in setting["runs"]]
        x = [i for i, _ in curves[0]]
        values = np.array([[v for _, v in c] for c in curves])
        mean, std = values.mean(0), values.std(0)
        ax.plot(x, mean, marker="o", label=f"{name} ({len(curves)} seeds)")
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("iteration (64 prompts x 8 completions)")
    ax.set_ylabel("greedy held-out accuracy")
    ax.set_title("Demo task by rollout precision (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--out", default="results/benchmarks/precision.json")
    parser.add_argument("--plot", default="docs/precision_curves.png")
    args = parser.parse_args()

    import ray

    import rllib_p3o
    from rllib_p3o.driver.progress import silence_driver_and_workers
    from rllib_p3o.tasks import build_demo_model

    silence_driver_and_workers()
    model = build_demo_model(args.model_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    report = {
        "setting": "demo: 64 prompts x 8 completions per iteration, max_tokens 3, tiny Qwen2 (0.3M), 1 vLLM runner, "
        f"local learner, 2 CPU cores; {args.iterations} iterations per run",
        "version": rllib_p3o.__version__,
        "settings": {},
    }
    for name in args.settings:
        runs = [run(name, model, seed, args.iterations, args.eval_every) for seed in args.seeds]
        rows = [row for r in runs for row in r["rows"]]
        finals = [r["heldout_final"] for r in runs]
        report["settings"][name] = {
            "config": SETTINGS[name],
            "median_per_iteration": {key: _median(rows, key) for key in rows[0]},
            "heldout_before": [r["heldout"][0][1] for r in runs],
            "heldout_at_budget": finals,
            "heldout_at_budget_mean": statistics.mean(finals),
            "heldout_at_budget_std": statistics.pstdev(finals),
            "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs],
        }
    print(
        f"\n{'setting':14s} {'mismatch_kl':>11s} {'|Δp|':>9s} {'ESS':>9s} {'probe':>9s} {'sync MB':>8s} "
        f"{'sync s':>7s} {'gen tok/s':>9s} {'update s':>8s}  held-out at budget"
    )
    for name, s in report["settings"].items():
        med = s["median_per_iteration"]
        print(
            f"{name:14s} {med['mismatch_kl']:11.2e} {med['mismatch_prob_abs_diff']:9.2e} {med['mismatch_ess']:9.6f} "
            f"{med['probe_max_abs_diff']:9.2e} {med['sync_bytes'] / 1e6:8.2f} {med['sync_s']:7.3f} "
            f"{med['generated_tokens_per_s']:9.0f} {med['learner_update_s']:8.3f}  "
            f"{s['heldout_at_budget_mean']:.3f} ± {s['heldout_at_budget_std']:.3f}"
        )
    if args.plot:
        plot(report, args.plot)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
