"""Offline-only P3O throughput: trajectory rows read (Ray Data) + tokenized/padded (prelearner) + trained per second.

    python benchmarks/offline.py --data runs/offline/trajectories [--iterations 20] [--rows 512]

Runs an offline-only P3O (no EnvRunner engine) on a recorded trajectory directory, using the demo base model, and
reports rows/s and trained tokens/s over the iterations after the first (the first includes Ray Data's start-up,
reported separately). Writes results/benchmarks/offline.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _report import write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="trajectory Parquet file or directory")
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rows", type=int, default=512, help="rows per training batch")
    parser.add_argument("--out", default="results/benchmarks/offline.json")
    args = parser.parse_args()

    import ray

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics
    from rllib_p3o.data.trajectories import validate_trajectories
    from rllib_p3o.tasks import build_demo_model

    model = build_demo_model(args.model_dir)
    t0 = time.perf_counter()
    report = validate_trajectories(args.data, vocab_size=64)
    validate_s = time.perf_counter() - t0
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = (
        P3OConfig()
        .training(model=model, group_size=8, prompts_per_step=args.rows // 8, lr=1e-4)
        .offline_data(input_=[args.data])
        .env_runners(num_env_runners=0)
    )
    algo = config.build_algo()
    walls, rows, tokens, reads = [], [], [], []
    for i in range(args.iterations + 1):
        t = time.perf_counter()
        res = algo.train()
        wall = time.perf_counter() - t
        p = res[metrics.P3O]
        ess = metrics.lookup(res, *metrics.LEARNER, metrics.ESS)
        print(
            f"iter {i + 1:3d}  {wall:.2f}s  read {p[metrics.TIME_OFFLINE_READ_S]:.2f}s  "
            f"train {p[metrics.TIME_TRAIN_S]:.2f}s  ess {ess:.3f}",
            flush=True,
        )
        if i == 0:
            first = wall
            continue
        walls.append(wall)
        rows.append(p[metrics.NUM_OFFLINE_ROWS])
        tokens.append(p[metrics.TRAINED_TOKENS])
        reads.append(p[metrics.TIME_OFFLINE_READ_S])
    algo.stop()
    result = {
        "dataset_rows": report.num_rows,
        "files": len(report.files),
        "validate_s": validate_s,
        "validate_rows_per_s": report.num_rows / validate_s,
        "first_iteration_s": first,
        "rows_per_iteration": statistics.mean(rows),
        "rows_per_s": sum(rows) / sum(walls),
        "trained_tokens_per_s": sum(tokens) / sum(walls),
        "read_share_of_wall": sum(reads) / sum(walls),
    }
    write_report(result, args.out)


if __name__ == "__main__":
    main()
