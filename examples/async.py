"""Async P3O on the demo task: runners keep generating while the learner updates (bounded staleness).

    python examples/async.py [--out runs/async] [--max-staleness 2] [--time-limit 600]

Trains the demo base model with ``async_sampling=True`` through ``tune.Tuner`` and prints held-out accuracy,
staleness and dropped samples; writes runs/async/summary.json and a plot. On 2 CPU cores the runner and the
learner share the cores, so overlap buys less than on a GPU node (see benchmarks/async_vs_sync.py).

The config is the demo's (`rllib_p3o.tasks.demo_config`) plus the two async options, spelled out as a
``P3OConfig()`` chain, the way the README's usage builds one.
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

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import metrics
    from rllib_p3o.driver.progress import plot_training_curves
    from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

    model = start(out)
    task = ArithmeticTask()
    config = (
        P3OConfig()
        .environment(
            env_config={
                "dataset": task.train_rows(),
                "eval_dataset": task.heldout_rows(),
                "reward_fn": arithmetic_reward,
            }
        )
        .training(
            model=model,
            loss="p3o",
            group_size=8,
            prompts_per_step=64,
            max_tokens=3,
            lr=[[0, 1e-5], [5120, 5e-4]],  # linear warm-up over the first 10 iterations
            minibatch_size=256,
            eval_interval=5,
            async_sampling=True,
            max_staleness=args.max_staleness,
        )
        .env_runners(num_env_runners=1)  # one vLLM engine, generating while the learner updates
        .learners(num_learners=0)  # the learner in the driver (Tune's trial actor)
        .debugging(seed=0)
    )
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
