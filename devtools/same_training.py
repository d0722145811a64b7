"""Whether a change of code left training as it was: the demo's config trained for a few iterations on this checkout,
its training values and per-iteration times written as JSON; two such files compared.

    python -m devtools.same_training run OUT.json [--model-dir runs/demo/base_model] [--iterations 10]
        [--config demo|bench] [--loss-config '{"trust_region": "none"}'] [--training '{"kl_ref_coeff": 0.1}']
    python -m devtools.same_training compare BEFORE.json AFTER.json [BEFORE2.json AFTER2.json ...]

``run`` builds `rllib_p3o.tasks.demo_config` (``--config bench``: the sorting bench's trial config,
`rllib_p3o.tasks.bench_config`, with the bench's base model as ``--model-dir``; one vLLM runner, a local learner; no
Tune) with the settings given, so
that a checkout from before a change of defaults trains the same config, and records every numeric result value of
each iteration. ``compare`` says whether the training values (everything but times, throughputs, process ids and
the machine's load) that both files report are equal, bit for bit (NaN equal to NaN), names the values only one of
them reports (a metric added or removed), and gives the mean seconds per iteration (after the first two) of each
file and the after/before ratio; runs made alternately (before, after, before, after) on one machine give the
ratio's spread. Exits 1 when a training value differs.

Run it from a copy of the repository at each commit, with that copy's environment (e.g. a second clone and its
``.venv``): the values are the checkout's own.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any, Dict, List

# Result keys that measure the machine, not the training: containing one of these words, or in seconds (``..._s``).
MACHINE_WORDS = ("time", "timer", "throughput", "pid", "util", "load", "date", "idle", "actor_reused")
WARMUP = 2  # iterations left out of the time per iteration (engine and allocator warm-up)


def _numbers(result: Dict[str, Any], prefix: str = "") -> Dict[str, float]:
    out: Dict[str, float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_numbers(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def run(
    out: str,
    model_dir: str,
    iterations: int,
    loss_config: Dict[str, Any],
    training: Dict[str, Any],
    config: str = "demo",
) -> None:
    import time

    import ray

    if config == "bench":
        from rllib_p3o.tasks.bench_config import bench_config as build_config
    else:
        from rllib_p3o.tasks.demo_config import demo_config as build_config

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    kwargs = dict(training)
    if loss_config:
        kwargs["loss_config"] = loss_config
    algo = build_config(model_dir, **kwargs).build_algo()
    rows: List[Dict[str, float]] = []
    seconds: List[float] = []
    for i in range(iterations):
        t0 = time.perf_counter()
        rows.append(_numbers(algo.train()))
        seconds.append(time.perf_counter() - t0)
        print(f"iteration {i + 1}/{iterations}: {seconds[-1]:.2f} s", flush=True)
    algo.stop()
    ray.shutdown()
    with open(out, "w") as f:
        json.dump({"results": rows, "seconds": seconds}, f)


def _training_values(row: Dict[str, float]) -> Dict[str, float]:
    return {k: v for k, v in row.items() if not k.endswith("_s") and not any(word in k for word in MACHINE_WORDS)}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def compare(paths: List[str]) -> int:
    if len(paths) < 2 or len(paths) % 2:
        raise SystemExit("compare takes pairs: BEFORE.json AFTER.json [BEFORE2.json AFTER2.json ...]")
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    reference = [_training_values(r) for r in runs[0]["results"]]
    differing = 0
    for path, run_ in zip(paths[1:], runs[1:]):
        values = [_training_values(r) for r in run_["results"]]
        diffs = [
            f"iteration {i + 1}, {key}: {a[key]} vs {b[key]}"
            for i, (a, b) in enumerate(zip(reference, values))
            for key in sorted(set(a) & set(b))
            if not _same(a[key], b[key])
        ]
        only = sorted({k for a, b in zip(reference, values) for k in set(a) ^ set(b)})
        if len(values) != len(reference):
            diffs.append(f"{len(reference)} iterations vs {len(values)}")
        differing += bool(diffs)
        count = sum(len(set(a) & set(b)) for a, b in zip(reference, values))
        verdict = f"DIFFERS from {paths[0]}: {diffs[0]} ({len(diffs)} values)" if diffs else "equal"
        print(f"{path}: {verdict}; {count} training values compared to {paths[0]}'s")
        if only:  # a metric one checkout reports and the other does not (added or removed, not changed)
            print(f"  reported by one of the two only: {', '.join(only)}")
    means = [statistics.mean(r["seconds"][WARMUP:] or r["seconds"]) for r in runs]  # (a short run: every one)
    ratios = [after / before for before, after in zip(means[::2], means[1::2])]
    print("seconds per iteration: " + ", ".join(f"{p} {m:.3f}" for p, m in zip(paths, means)))
    spread = f" (pairs: {', '.join(f'{r:.3f}' for r in ratios)})" if len(ratios) > 1 else ""
    print(f"after/before: {statistics.mean(ratios):.3f}{spread}")
    return 1 if differing else 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("out")
    run_parser.add_argument("--model-dir", default="runs/demo/base_model")
    run_parser.add_argument("--iterations", type=int, default=10)
    run_parser.add_argument("--config", choices=("demo", "bench"), default="demo")
    run_parser.add_argument("--loss-config", type=json.loads, default={})
    run_parser.add_argument("--training", type=json.loads, default={})
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.model_dir, args.iterations, args.loss_config, args.training, args.config)
        return 0
    return compare(args.paths)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
