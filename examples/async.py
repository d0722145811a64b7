"""Async P3O on the demo task: runners keep generating while the learner updates (bounded staleness).

    python examples/async.py [--out runs/async] [--max-staleness 2] [--time-limit 600]

Trains the demo base model with ``async_sampling=True`` through ``tune.Tuner`` and prints held-out accuracy,
staleness and dropped samples; writes runs/async/summary.json and a plot. On 2 CPU cores the runner and the
learner share the cores, so overlap buys less than on a GPU node (see benchmarks/async_vs_sync.py).
"""

from __future__ import annotations

import argparse
import os

from _common import add_run_args, run_tuner, start, stop_at, write_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser, "runs/async")
    parser.add_argument("--max-staleness", type=int, default=2)
    args = parser.parse_args()
    out = os.path.abspath(args.out)

    from rllib_p3o.progress import plot_training_curves
    from rllib_p3o.tasks.demo import demo_config

    model = start(out)
    config = demo_config(model, async_sampling=True, max_staleness=args.max_staleness)
    df, summary = run_tuner(config, "async", out, stop_at(0.95, args.time_limit, args.iterations))
    summary["staleness_mean"] = float(df["p3o/staleness_mean"].mean())
    summary["dropped_stale_samples"] = int(df["p3o/dropped_stale_samples_lifetime"].iloc[-1])
    summary["plot"] = plot_training_curves({"async": df}, os.path.join(out, "async_curves.png"),
                                           title=f"async P3O (max staleness {args.max_staleness})")
    write_summary(summary, out)


if __name__ == "__main__":
    main()
