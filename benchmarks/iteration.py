"""Per-iteration time split of P3O on the demo setting, and vLLM vs transformers generation on the same batch.

    python benchmarks/iteration.py [--iterations 30] [--out benchmarks/results/iteration.json]

Part 1 builds the demo algorithm (1 vLLM runner, local learner) and runs N iterations. It reports the mean of
the per-iteration split: generate (sampling incl. reward scoring), learner update (forward/backward/optimizer
incl. RLlib's learner plumbing), weight sync (state fetch + in-place engine reload + probe check), and
everything else (batching, advantages, RLlib bookkeeping). It also reports generated and trained tokens/s.
Part 2 times one warm generation of the same batch (prompts x group_size, same max_tokens, T=1, sampled-token
log-probs returned) with vLLM and with `transformers.generate`, each in a 1-CPU Ray actor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _report import write_report


def _engine_benchmark(model: str, prompts: list, n: int, max_tokens: int, repeats: int = 3) -> dict:
    import ray

    @ray.remote(num_cpus=1)
    def bench_vllm():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoTokenizer
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        tok = AutoTokenizer.from_pretrained(model)
        ids = [TokensPrompt(prompt_token_ids=tok(p).input_ids) for p in prompts]
        llm = LLM(
            model=model,
            dtype="float32",
            enforce_eager=True,
            kv_cache_memory_bytes=256 << 20,
            max_model_len=64,
            generation_config="vllm",
            seed=0,
        )
        sp = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=0, ignore_eos=True)
        llm.generate(ids, sp, use_tqdm=False)  # warm-up (first call pays kernel set-up)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = llm.generate(ids, sp, use_tqdm=False)
            times.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for o in out for c in o.outputs)
        return {"seconds": min(times), "tokens": tokens}

    @ray.remote(num_cpus=1)
    def bench_hf():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        lm = AutoModelForCausalLM.from_pretrained(model).eval()
        x = torch.tensor([tok(p).input_ids for p in prompts])  # equal-length prompts in the demo task

        def run():
            with torch.no_grad():
                out = lm.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    do_sample=True,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_tokens,
                    min_new_tokens=max_tokens,
                    num_return_sequences=n,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=tok.pad_token_id,
                )
                logits = torch.stack(out.logits, 1).float()
                new = out.sequences[:, x.shape[1] :]
                return torch.log_softmax(logits, -1).gather(-1, new[..., None]).squeeze(-1), new

        run()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, new = run()
            times.append(time.perf_counter() - t0)
        return {"seconds": min(times), "tokens": int(new.numel())}

    v, h = ray.get(bench_vllm.remote()), ray.get(bench_hf.remote())
    return {
        "batch": f"{len(prompts)} prompts x {n} samples x {max_tokens} tokens",
        "vllm_tokens_per_s": v["tokens"] / v["seconds"],
        "hf_tokens_per_s": h["tokens"] / h["seconds"],
        "vllm_over_hf": (v["tokens"] / v["seconds"]) / (h["tokens"] / h["seconds"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument(
        "--loss", default="p3o", help="a registered loss (grpo_tis etc. also time π_old's recomputation)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--out", default="benchmarks/results/iteration.json")
    args = parser.parse_args()

    import ray

    from rllib_p3o.core import metrics
    from rllib_p3o.tasks import ArithmeticTask, build_demo_model
    from rllib_p3o.tasks.demo_config import demo_config

    model = build_demo_model(args.model_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = demo_config(model, eval_interval=0, loss=args.loss)
    t0 = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t0
    rows = []
    for i in range(args.warmup + args.iterations):
        t = time.perf_counter()
        res = algo.train()
        wall = time.perf_counter() - t
        if i >= args.warmup:
            p = res[metrics.P3O]
            learner = res[metrics.LEARNER[0]][metrics.LEARNER[1]]
            gen, train, sync = p[metrics.TIME_GENERATE_S], p[metrics.TIME_TRAIN_S], p[metrics.TIME_SYNC_S]
            rows.append(
                {
                    "wall_s": wall,
                    "generate_s": gen,
                    "learner_update_s": train,
                    "weight_sync_s": sync,
                    "other_s": wall - gen - train - sync,
                    "generated_tokens_per_s": p[metrics.GENERATED_TOKENS_PER_S],
                    "trained_tokens_per_s": p[metrics.TRAINED_TOKENS_PER_S],
                    "completions": p[metrics.NUM_COMPLETIONS],
                    # π_old's forward pass, part of the learner update (losses that need it)
                    "old_logprobs_s": learner.get(metrics.OLD_LOGPROBS_S, 0.0),
                }
            )
        print(
            f"iter {i + 1:3d}  wall {wall:.2f}s  "
            + (
                "(warm-up)"
                if i < args.warmup
                else f"gen {rows[-1]['generate_s']:.2f}s  learn {rows[-1]['learner_update_s']:.2f}s  "
                f"sync {rows[-1]['weight_sync_s']:.3f}s  other {rows[-1]['other_s']:.2f}s"
            ),
            flush=True,
        )
    algo.stop()

    mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
    split = {k: mean[k] / mean["wall_s"] for k in ("generate_s", "learner_update_s", "weight_sync_s", "other_s")}
    task = ArithmeticTask()
    prompts = [r["prompt"] for r in task.train_rows()[: config.prompts_per_step]]
    engines = _engine_benchmark(model, prompts, config.group_size, config.max_tokens)
    report = {
        "setting": "demo: 64 prompts x 8 completions, max_tokens 3, tiny Qwen2 (0.3M), 1 vLLM runner, "
        "local learner, 2 CPU cores",
        "loss": args.loss,
        "build_algo_s": build_s,
        "iterations": len(rows),
        "mean_per_iteration": mean,
        "share_of_wall_time": split,
        "generation_engines": engines,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
