"""`make demo`: P3O teaches a tiny language model ``(a+b)%10`` from a verifier's reward, through tune.Tuner, on CPU.

1. Builds the base model locally (tokenizer + tiny Qwen2, ~1 minute of pretraining on plain sums of the training
   pairs, with the task's format on 30% of them, answered right 40% of the time; cached under OUT/base_model). It
   knows the format and roughly the operation: held-out accuracy 0.22-0.56 before RL, depending on the seed and
   the machine (docs/results/demo.md).
2. Trains it with P3O (vLLM rollouts in an EnvRunner actor, an RLlib learner) via ``tune.Tuner("P3O")`` until the
   greedy held-out accuracy reaches ``--target``, printing one line per 5 iterations.
3. Writes OUT/demo_curves.png (train reward, held-out accuracy, ESS), the final model in Hugging Face format
   (OUT/final_model) and OUT/summary.json. Exits with status 1 if the target was not reached in time.

    python examples/demo.py [--out runs/demo] [--target 0.9] [--time-limit 600] [--seed 0] [--base-seed 0] [--lora R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import add_run_args, run_tuner, start, stop_at, write_summary

from rllib_p3o.core.losses import LOSSES
from rllib_p3o.tasks.pretrain import PretrainingProgress

PRINT_EVERY = 5  # iterations; also the held-out evaluation interval of the demo config


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser, "runs/demo")
    parser.add_argument("--loss", default="p3o", choices=sorted(LOSSES))
    parser.add_argument("--seed", type=int, default=0, help="RL seed (sampling, batch order)")
    parser.add_argument("--base-seed", type=int, default=0, help="base model seed (init, corpus, pretraining)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the base model's pretraining")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (after warm-up)")
    parser.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="R",
        help="train a LoRA adapter of rank R (alpha 2R, every linear layer) instead of all weights",
    )
    parser.add_argument("--pretrain-steps", type=int, default=1500, help="base model pretraining steps")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    t_start = time.time()

    print(
        f"rllib-p3o demo: {args.loss.upper()} on (a+b)%10 with a tiny Qwen2 model, vLLM rollouts, 2 CPU cores\n"
        f"[1/3] base model (seed {args.base_seed}) -> {os.path.relpath(out)}/base_model",
        flush=True,
    )
    model = start(
        out,
        base_seed=args.base_seed,
        threads=args.threads,
        pretrain_steps=args.pretrain_steps,
        progress=PretrainingProgress("      ", args.pretrain_steps),  # a line about every 10 s
    )
    print(f"      ready after {_clock(time.time() - t_start)}", flush=True)

    from rllib_p3o.driver.progress import plot_training_curves
    from rllib_p3o.learner.rl_module import HFCausalLMRLModule
    from rllib_p3o.tasks.demo_config import demo_config

    print(
        f"[2/3] {args.loss.upper()} training via tune.Tuner: stops at held-out accuracy >= {args.target}, at the "
        f"latest after {_clock(args.time_limit)} of training or {args.iterations} iterations",
        flush=True,
    )
    config = demo_config(
        model,
        loss=args.loss,
        **({"lr": [[0, 1e-5], [5120, args.lr]]} if args.lr else {}),
        **({"lora": {"r": args.lora, "alpha": 2 * args.lora}} if args.lora else {}),
    )
    df, summary = run_tuner(
        config.debugging(seed=args.seed),
        "demo",
        out,
        stop_at(args.target, args.time_limit, args.iterations),
        target=args.target,
        print_every=PRINT_EVERY,
        time_limit=args.time_limit,
        max_iterations=args.iterations,
    )

    print("[3/3] curves, final model, summary", flush=True)
    summary["plot"] = plot_training_curves(
        {args.loss: df}, os.path.join(out, "demo_curves.png"), title="P3O on (a+b)%10, tiny Qwen2, 2 CPU cores"
    )
    module_dir = os.path.join(summary["checkpoint"], "learner_group", "learner", "rl_module", "default_policy")
    summary["final_model"] = HFCausalLMRLModule.from_checkpoint(module_dir).save_pretrained(
        os.path.join(out, "final_model"), tokenizer_from=model, merged=True
    )  # LoRA: the adapter merged in
    summary.update(
        loss=args.loss,
        lora_rank=args.lora,
        seed=args.seed,
        base_seed=args.base_seed,
        threads=args.threads,
        total_time_s=time.time() - t_start,
    )
    df.to_csv(os.path.join(out, "metrics.csv"), index=False)
    summary_path = write_summary(summary, out, echo=False)

    rel = os.path.relpath
    if summary["target_reached"]:
        print(
            f"Target reached: held-out accuracy {summary['heldout_before']:.3f} -> "
            f"{summary['heldout_after']:.3f} (>= {args.target}) after {_clock(summary['seconds_to_target'])} of "
            f"training, {summary['iterations_to_target']} iterations; whole run {_clock(summary['total_time_s'])}."
        )
    else:
        print(
            f"Target NOT reached: held-out accuracy {summary['heldout_before']:.3f} -> "
            f"{summary['heldout_after']:.3f} (best {summary['heldout_max']:.3f}, target {args.target}) after "
            f"{_clock(summary['train_time_s'])} of training, {summary['iterations']} iterations. Look at "
            f"the 'w/o signal' column above and at the plot."
        )
    print(
        f"  plot     {rel(summary['plot'])}\n  model    {rel(summary['final_model'])} (Hugging Face format)\n"
        f"  summary  {rel(summary_path)}",
        flush=True,
    )
    return 0 if summary["target_reached"] else 1


if __name__ == "__main__":
    sys.exit(main())
