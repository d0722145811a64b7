"""Where a run's start-up goes: from `build_algo()` to the first `train()` result, part by part.

    python benchmarks/startup.py [--repeats 3] [--out results/benchmarks/startup.json]

The setting of `benchmarks/peer_trl.py` (`_bench_settings.py`) at 0.33M parameters (1 vLLM runner, a local
learner). Each repeat is a fresh process (imports are part of a start). Reported, as the median over repeats:
- ``imports_s``: importing this package (torch, Ray, RLlib, transformers) in the driver;
- ``ray_init_s``: `ray.init` (Ray's own processes, its prestarted workers);
- ``build_algo_s``, split by cProfile's cumulative time of RLlib's setup phases: the global seed (RLlib's
  deterministic torch mode imports torch's compiler stack), the EnvRunnerGroup (the remote runner actor: its
  imports, then ``runner_init_s`` of `VLLMEnvRunner.__init__`, of which ``runner_engine_s`` starts the vLLM
  engine; and the driver's local runner), the learner group, and P3O's first weight sync (verified by the probe;
  the runner has started by then: P3O's setup asks it for its tokenizer's pad id first);
- ``first_train_s``: the first `train()` call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict

HERE = os.path.dirname(os.path.abspath(__file__))
# RLlib/P3O setup phases: (label, cProfile function key (file suffix, line-independent name)).
PHASES = {
    "seed_s": ("deterministic.py", "update_global_seed_if_necessary"),
    "env_runner_group_s": ("env_runner_group.py", "__init__"),
    "learner_group_s": ("learner_group.py", "__init__"),
    "first_sync_s": ("push.py", "push_verified"),
}


def measure() -> Dict[str, float]:
    """One start, in this (fresh) process."""
    t0 = time.perf_counter()
    import cProfile
    import pstats

    import _bench_settings as bench
    import ray

    from rllib_p3o import P3OConfig
    from rllib_p3o.runner.env_runner import VLLMEnvRunner

    t1 = time.perf_counter()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, os.path.dirname(HERE)])}},
    )
    t2 = time.perf_counter()
    model = bench.build_model("0.33M", "runs/peer_trl")
    config = (
        P3OConfig()
        .environment(env_config={"dataset": bench.task_rows(), "reward_fn": bench.sum_reward})
        .training(
            model=model,
            group_size=bench.GROUP_SIZE,
            prompts_per_step=bench.PROMPTS_PER_STEP,
            max_tokens=bench.MAX_TOKENS,
            lr=bench.LR,
            eval_interval=0,
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
    profile = cProfile.Profile()
    t3 = time.perf_counter()
    profile.enable()
    algo = config.build_algo()
    profile.disable()
    t4 = time.perf_counter()
    algo.train()
    t5 = time.perf_counter()
    runner = algo._runners.call_first(VLLMEnvRunner.startup_times)
    algo.stop()
    ray.shutdown()
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {
        "imports_s": t1 - t0,
        "ray_init_s": t2 - t1,
        "build_algo_s": t4 - t3,
        "first_train_s": t5 - t4,
        "build_algo_to_first_result_s": t5 - t3,
        "runner_init_s": runner["init_s"],
        "runner_engine_s": runner["engines_s"],
    }
    for label, (file, name) in PHASES.items():
        out[label] = sum(v[3] for k, v in stats.items() if k[0].endswith(file) and k[2] == name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/benchmarks/startup.json")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        with open(args.worker_out, "w") as f:
            json.dump(measure(), f)
        return
    runs = []
    for i in range(args.repeats):
        out = f"/tmp/p3o_startup_{os.getpid()}.json"
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker-out", out], check=True, capture_output=True
        )
        with open(out) as f:
            runs.append(json.load(f))
        print(
            f"start {i + 1}/{args.repeats}: build_algo {runs[-1]['build_algo_s']:.1f} s, first result "
            f"{runs[-1]['build_algo_to_first_result_s']:.1f} s after build_algo()",
            flush=True,
        )
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    report = {
        "setting": "peer_trl.py's setting at 0.33M: 1 vLLM runner, local learner, 2 CPU cores",
        "median": median,
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    for k, v in median.items():
        print(f"{k:32s} {v:6.2f}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
