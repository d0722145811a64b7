"""Tool use: P3O teaches a tiny language model to call a calculator for two-digit products, through tune.Tuner.

A tiny model cannot multiply two-digit numbers. Its base model (`rllib_p3o.tasks.products`) has seen the tool
format only in its pretraining text: additions written as calculator calls, and products answered directly (95%)
or with the calculator (5%). Multi-turn episodes (`rllib_p3o.runner.multiturn.ToolEnv`): the model may call
``<tool_call>calc(47*86)</tool_call>``, the environment answers ``<tool_response>4042</tool_response>``, the model
answers; the reward checks the final answer.

1. Builds the base model (~2-3 minutes of pretraining on 2 cores; cached under OUT/base_model).
2. Two runs through ``tune.Tuner("P3O")`` with the same settings: WITH the calculator, until the greedy held-out
   accuracy reaches ``--target``; then WITHOUT it (calls return an error) for three times as many iterations
   (at least 10).
3. Writes OUT/tool_use_curves.png (train reward, held-out accuracy, held-out tool calls per episode, ESS),
   OUT/summary.json and each run's metrics CSV. Exits with status 1 unless the run with the calculator reached the
   target and the run without it did not.

    python examples/tool_use.py [--out runs/tool_use] [--target 0.9] [--time-limit 900] [--seed 0] [--base-seed 0]
                                [--base-model DIR] [--plot PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import add_run_args, run_tuner, stop_at, write_summary

PRINT_EVERY = 2  # iterations; also the held-out evaluation interval


def tool_use_config(model: str, tools: dict, seed: int):
    from rllib_p3o import P3OConfig
    from rllib_p3o.runner.multiturn import ToolEnv
    from rllib_p3o.tasks.products import STOP_TOKENS, ProductTask, product_reward

    task = ProductTask()
    env_config = {
        "dataset": task.train_rows(),
        "eval_dataset": task.heldout_rows(),
        "reward_fn": product_reward,
        "multi_turn_env": ToolEnv,
        "tools": tools,
        "max_turns": 3,
        "max_total_tokens": 64,
        "stop_tokens": list(STOP_TOKENS),
    }
    return (
        P3OConfig()
        .environment(env_config=env_config)
        .training(
            model=model,
            loss="p3o",
            group_size=8,
            prompts_per_step=32,
            max_tokens=12,
            lr=[[0, 1e-5], [2560, 5e-4]],
            minibatch_size=128,
            eval_interval=PRINT_EVERY,
            eval_max_prompts=200,
        )
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=seed)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser, "runs/tool_use")
    parser.add_argument("--seed", type=int, default=0, help="RL seed (sampling, batch order)")
    parser.add_argument("--base-seed", type=int, default=0, help="base model seed (init, corpus, pretraining)")
    parser.add_argument("--pretrain-steps", type=int, default=2000)
    parser.add_argument(
        "--base-model",
        default=None,
        help="base model directory (default OUT/base_model; built "
        "there, or reused if it was built with the same settings)",
    )
    parser.add_argument("--plot", default=None, help="where to write the curves (default OUT/tool_use_curves.png)")
    parser.set_defaults(time_limit=900.0)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    base_dir = os.path.abspath(args.base_model or os.path.join(out, "base_model"))
    t_start = time.time()

    import logging

    import ray

    from rllib_p3o.core import metrics
    from rllib_p3o.driver.progress import CURVES, plot_training_curves, silence_driver_and_workers
    from rllib_p3o.tasks.products import build_tool_model, calc

    print(
        f"rllib-p3o tool use: a tiny model learns to call a calculator for two-digit products, 2 CPU cores\n"
        f"[1/3] base model (seed {args.base_seed}) -> {os.path.relpath(base_dir)}",
        flush=True,
    )
    env = silence_driver_and_workers()
    model = build_tool_model(
        base_dir,
        seed=args.base_seed,
        pretrain_steps=args.pretrain_steps,
        progress=lambda step, loss: (
            print(f"      pretraining step {step:4d}  loss {loss:.3f}", flush=True) if step % 500 == 0 else None
        ),
    )
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": env},
    )

    runs, summaries = {}, {}
    print(
        f"[2/3] WITH the calculator, via tune.Tuner: until held-out accuracy >= {args.target} (at most "
        f"{args.time_limit:.0f} s of training, {args.iterations} iterations)",
        flush=True,
    )
    runs["with calculator"], summaries["with_tool"] = run_tuner(
        tool_use_config(model, {"calc": calc}, args.seed),
        "with_tool",
        out,
        stop_at(args.target, args.time_limit, args.iterations),
        target=args.target,
        print_every=PRINT_EVERY,
        time_limit=args.time_limit,
        max_iterations=args.iterations,
    )
    iterations = max(10, 3 * summaries["with_tool"]["iterations"])
    print(f"      WITHOUT the calculator (calls return an error), {iterations} iterations", flush=True)
    runs["without calculator"], summaries["without_tool"] = run_tuner(
        tool_use_config(model, {}, args.seed),
        "without_tool",
        out,
        stop_at(float("inf"), args.time_limit, iterations),
        target=args.target,
        print_every=PRINT_EVERY,
        time_limit=args.time_limit,
        max_iterations=iterations,
    )

    print("[3/3] curves, summary", flush=True)
    tool_calls = (
        metrics.column(metrics.P3O, metrics.HELDOUT_PREFIX + "tool_calls"),
        "held-out tool calls per episode (greedy)",
    )
    plot = plot_training_curves(
        runs,
        args.plot or os.path.join(out, "tool_use_curves.png"),
        title="P3O, tool use: two-digit products with a calculator, tiny Qwen2, 2 CPU cores",
        curves=CURVES[:2] + (tool_calls,) + CURVES[2:],
        x="training_iteration",
    )
    for name, df in runs.items():
        df.to_csv(os.path.join(out, f"metrics_{name.replace(' ', '_')}.csv"), index=False)
    with_tool, without_tool = summaries["with_tool"], summaries["without_tool"]
    ok = with_tool["target_reached"] and without_tool["heldout_max"] < args.target
    summary = {
        **summaries,
        "plot": plot,
        "seed": args.seed,
        "base_seed": args.base_seed,
        "success": ok,
        "total_time_s": time.time() - t_start,
    }
    path = write_summary(summary, out, echo=False)
    print(
        f"Held-out accuracy, greedy:\n"
        f"  with the calculator     {with_tool['heldout_before']:.3f} -> {with_tool['heldout_after']:.3f} "
        f"({'target reached' if with_tool['target_reached'] else 'target NOT reached'}, "
        f"{with_tool['iterations']} iterations, {with_tool['train_time_s']:.0f} s of training)\n"
        f"  without the calculator  {without_tool['heldout_before']:.3f} -> {without_tool['heldout_after']:.3f} "
        f"(best {without_tool['heldout_max']:.3f}, {without_tool['iterations']} iterations, "
        f"{without_tool['train_time_s']:.0f} s of training)\n"
        f"  whole run {time.time() - t_start:.0f} s; plot {os.path.relpath(plot)}, summary {os.path.relpath(path)}",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
