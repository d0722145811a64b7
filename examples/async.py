"""Async P3O on the demo task: runners keep generating while the learner updates (bounded staleness).

    python examples/async.py [--out runs/async] [--max-staleness 2] [--time-limit 600]

Trains the demo base model with ``async_sampling=True`` through ``tune.Tuner`` and prints held-out accuracy,
staleness and dropped samples; writes runs/async/summary.json and a plot. On 2 CPU cores the runner and the
learner share the cores, so overlap buys less than on a GPU node (see benchmarks/async_vs_sync.py).

The config is the demo's (`rllib_p3o.tasks.demo_config`) plus the two async options
(`rllib_p3o.tasks.scenarios.async_demo_run`): ``demo_config(model, async_sampling=True, max_staleness=2)``.
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

    from rllib_p3o.core import metrics
    from rllib_p3o.driver.progress import plot_training_curves
    from rllib_p3o.tasks.scenarios import async_demo_run

    model = start(out)
    # One vLLM engine generating while the learner (in Tune's trial actor) updates.
    config = async_demo_run(model, max_staleness=args.max_staleness)
    df, summary = run_tuner(config, "async", out, stop_at(0.95, args.time_limit, args.iterations))
    summary["staleness_mean"] = float(df[metrics.column(metrics.P3O, metrics.STALENESS_MEAN)].mean())
    summary["dropped_stale_samples"] = int(
        df[metrics.column(metrics.P3O, metrics.DROPPED_STALE_SAMPLES_LIFETIME)].iloc[-1]
    )
    summary["plot"] = plot_training_curves(
        {"async": df}, os.path.join(out, "async_curves.png"), title=f"async P3O (max staleness {args.max_staleness})"
    )
    write_summary(summary, out)


if __name__ == "__main__":
    main()
