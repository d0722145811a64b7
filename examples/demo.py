"""`make demo`: train the built-in tiny model on modular addition with P3O, through tune.Tuner, on CPU.

1. Builds the base model locally (tokenizer + tiny Qwen2, ~1 minute of pretraining on plain sums of the
   training pairs; cached under runs/demo/base_model).
2. Trains it with P3O (vLLM rollouts in an EnvRunner actor, RLlib learner) via ``tune.Tuner("P3O")``, printing one
   line per iteration.
3. Writes runs/demo/demo_curves.png (train reward, held-out accuracy, ESS) and the final model in Hugging Face
   format to runs/demo/final_model.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--iterations", type=int, default=1000, help="stop after this many iterations")
    parser.add_argument("--time-limit", type=float, default=600.0, help="stop training after this many seconds")
    parser.add_argument("--target", type=float, default=0.95, help="stop once held-out accuracy reaches this")
    parser.add_argument("--loss", default="p3o", choices=["p3o", "grpo"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (after warm-up)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    import ray
    from ray import tune

    import rllib_p3o  # noqa: F401  (registers "P3O" with Tune)
    from rllib_p3o.progress import IterationPrinter, plot_training_curves
    from rllib_p3o.rl_module import HFCausalLMRLModule
    from rllib_p3o.tasks import build_demo_model
    from rllib_p3o.tasks.demo import demo_config

    t0 = time.time()
    print(f"[1/3] base model -> {out}/base_model", flush=True)
    model = build_demo_model(os.path.join(out, "base_model"),
                             progress=lambda s, l: print(f"      pretraining step {s:5d}  loss {l:.3f}", flush=True))
    print(f"      ready in {time.time() - t0:.0f}s", flush=True)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(f"[2/3] P3O training via tune.Tuner (stop: held-out accuracy >= {args.target}, {args.time_limit:.0f}s "
          f"or {args.iterations} iterations)", flush=True)

    def stop(trial_id: str, result: dict) -> bool:
        heldout = result.get("p3o", {}).get("heldout_reward_mean", float("nan"))
        return (heldout >= args.target or result["time_total_s"] >= args.time_limit
                or result["training_iteration"] >= args.iterations)

    tuner = tune.Tuner(
        "P3O",
        param_space=demo_config(model, loss=args.loss, **({"lr": [[0, 1e-5], [5120, args.lr]]} if args.lr else {}))
        .debugging(seed=args.seed),
        run_config=tune.RunConfig(
            name="demo", storage_path=out, verbose=0, callbacks=[IterationPrinter(every=5)],
            stop=stop,
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True, num_to_keep=1),
            failure_config=tune.FailureConfig(fail_fast="raise"),
        ),
    )
    result = tuner.fit()[0]
    if result.error:
        raise result.error
    df = result.metrics_dataframe

    print("[3/3] curves and final model", flush=True)
    plot = plot_training_curves({args.loss: df}, os.path.join(out, "demo_curves.png"),
                                title="P3O on (a+b)%10, tiny Qwen2, 2 CPU cores")
    module_dir = os.path.join(result.checkpoint.path, "learner_group", "learner", "rl_module", "default_policy")
    final = HFCausalLMRLModule.from_checkpoint(module_dir).save_pretrained(os.path.join(out, "final_model"),
                                                                           tokenizer_from=model)
    heldout = df["p3o/heldout_reward_mean"].dropna()
    summary = {
        "heldout_first": float(heldout.iloc[0]), "heldout_last": float(heldout.iloc[-1]),
        "heldout_max": float(heldout.max()),
        "seconds_to_heldout_0.9": (float(df.loc[heldout[heldout >= 0.9].index[0], "time_total_s"])
                                   if (heldout >= 0.9).any() else None),
        "iterations": int(df["training_iteration"].iloc[-1]), "train_time_s": float(df["time_total_s"].iloc[-1]),
        "plot": plot, "final_model": final,
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    df.to_csv(os.path.join(out, "metrics.csv"), index=False)
    print(json.dumps(summary, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
