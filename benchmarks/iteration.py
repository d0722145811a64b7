"""Per-iteration time split of P3O, and vLLM vs transformers generation on the same batch.

    python benchmarks/iteration.py [--iterations 30] [--out results/benchmarks/iteration.json]
    python benchmarks/iteration.py --max-tokens 16 128 512 [--size 2.44M] [--mode sync async] [--vllm-compiled]
        [--out results/benchmarks/iteration_lengths.json]

Without ``--max-tokens``: the demo setting (64 prompts x 8 completions of at most 3 tokens, the demo's base model).
With ``--max-tokens``: at each completion limit, the spread-length model of `_spread_model` (completions of
geometric lengths with mean ``max_tokens``: many short, some long, about a third at the limit) on the peer
benchmark's setting (8 prompts x 8 completions, lr 1e-4), in each ``--mode``.

Part 1 builds the algorithm (1 vLLM runner, local learner) and runs N iterations. It reports the mean of the
per-iteration split: generate (sampling incl. reward scoring), learner update (forward/backward/optimizer incl.
RLlib's learner plumbing), weight sync (state fetch + in-place engine reload + probe check), and everything else
(batching, advantages, RLlib bookkeeping); generated and trained tokens/s; and the share of the learner's token
positions that were padding (rows run in length buckets: `rllib_p3o.learner.length_buckets`).
Part 2 times one warm generation of the same batch (prompts x group_size, same max_tokens, T=1, sampled-token
log-probs returned) with vLLM and with `transformers.generate`, each in a 1-CPU Ray actor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _report import write_report


def _engine_benchmark(
    model: str, prompts: list, n: int, max_tokens: int, spread: bool, repeats: int = 3, compiled: bool = False
) -> dict:
    """Warm generation of one batch with vLLM (as a runner's engine: sampled-token log-probs, seeded requests) and
    with `transformers.generate`, each in a 1-CPU Ray actor. ``spread``: completions end at EOS (the spread-length
    model), else every completion runs to ``max_tokens``. ``compiled``: also vLLM with its compiled model
    (``enforce_eager=False``, the runners' ``vllm_kwargs={"enforce_eager": False}``), which pays its compilation
    when the engine starts."""
    import ray

    @ray.remote(num_cpus=1)
    def bench_vllm(enforce_eager: bool = True):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoTokenizer
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        tok = AutoTokenizer.from_pretrained(model)
        ids = [TokensPrompt(prompt_token_ids=tok(p).input_ids) for p in prompts]
        t_start = time.perf_counter()
        llm = LLM(
            model=model,
            dtype="float32",
            enforce_eager=enforce_eager,
            kv_cache_memory_bytes=256 << 20,
            max_model_len=max_tokens + 32,
            generation_config="vllm",
            seed=0,
        )

        def params(call: int):
            return [
                SamplingParams(
                    n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=call * 1000 + g, ignore_eos=not spread
                )
                for g in range(len(ids))
            ]

        started = time.perf_counter() - t_start
        llm.generate(ids, params(0), use_tqdm=False)  # warm-up (first call pays kernel set-up)
        times, tokens = [], []
        for call in range(1, repeats + 1):
            t0 = time.perf_counter()
            out = llm.generate(ids, params(call), use_tqdm=False)
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(c.token_ids) for o in out for c in o.outputs))
        return {"seconds": sum(times), "tokens": sum(tokens), "engine_start_s": started}

    @ray.remote(num_cpus=1)
    def bench_hf():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        lm = AutoModelForCausalLM.from_pretrained(model).eval()
        x = torch.tensor([tok(p).input_ids for p in prompts])  # equal-length prompts in both tasks

        def run():
            with torch.no_grad():
                out = lm.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    do_sample=True,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_tokens,
                    min_new_tokens=None if spread else max_tokens,
                    num_return_sequences=n,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=tok.pad_token_id,
                )
                logits = torch.stack(out.logits, 1).float()
                new = out.sequences[:, x.shape[1] :]
                logp = torch.log_softmax(logits, -1).gather(-1, new[..., None]).squeeze(-1)
                return logp, int((new != tok.pad_token_id).sum())

        run()
        times, tokens = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, generated = run()
            times.append(time.perf_counter() - t0)
            tokens.append(generated)
        return {"seconds": sum(times), "tokens": sum(tokens)}

    v, h = ray.get(bench_vllm.remote()), ray.get(bench_hf.remote())
    report = {
        "batch": f"{len(prompts)} prompts x {n} samples, at most {max_tokens} tokens"
        + (" (ending at EOS)" if spread else ""),
        "vllm_tokens_per_s": v["tokens"] / v["seconds"],
        "vllm_engine_start_s": v["engine_start_s"],
        "hf_tokens_per_s": h["tokens"] / h["seconds"],
        "vllm_over_hf": (v["tokens"] / v["seconds"]) / (h["tokens"] / h["seconds"]),
    }
    if compiled:
        c = ray.get(bench_vllm.remote(False))
        report["vllm_compiled_tokens_per_s"] = c["tokens"] / c["seconds"]
        report["vllm_compiled_engine_start_s"] = c["engine_start_s"]
        report["vllm_compiled_over_hf"] = report["vllm_compiled_tokens_per_s"] / report["hf_tokens_per_s"]
    print(
        f"engines, {report['batch']}: vLLM {report['vllm_tokens_per_s']:.0f} tokens/s, "
        + (f"vLLM compiled {report['vllm_compiled_tokens_per_s']:.0f}, " if compiled else "")
        + f"transformers generate {report['hf_tokens_per_s']:.0f}",
        flush=True,
    )
    return report


def run_iterations(config, warmup: int, iterations: int, label: str = "") -> dict:
    """Build the algorithm, run ``warmup + iterations`` iterations; the mean split of the timed ones."""
    from rllib_p3o.core import metrics

    t0 = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t0
    rows = []
    for i in range(warmup + iterations):
        t = time.perf_counter()
        res = algo.train()
        wall = time.perf_counter() - t
        if i >= warmup:
            p = res[metrics.P3O]
            learner = metrics.lookup(res, *metrics.LEARNER) or {}
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
                    "completion_len_mean": p[metrics.COMPLETION_LEN_MEAN],
                    "padding_share": learner.get(metrics.PADDING_SHARE, float("nan")),
                    "padding_share_unbucketed": learner.get(metrics.PADDING_SHARE_UNBUCKETED, float("nan")),
                    # π_old's forward pass, part of the learner update (losses that need it)
                    "old_logprobs_s": learner.get(metrics.OLD_LOGPROBS_S, 0.0),
                }
            )
        print(
            f"{label}iter {i + 1:3d}  wall {wall:.2f}s  "
            + (
                "(warm-up)"
                if i < warmup
                else f"gen {rows[-1]['generate_s']:.2f}s  learn {rows[-1]['learner_update_s']:.2f}s  "
                f"sync {rows[-1]['weight_sync_s']:.3f}s  other {rows[-1]['other_s']:.2f}s  "
                f"padding {rows[-1]['padding_share']:.2f} (unbucketed {rows[-1]['padding_share_unbucketed']:.2f})"
            ),
            flush=True,
        )
    algo.stop()
    mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
    split = {k: mean[k] / mean["wall_s"] for k in ("generate_s", "learner_update_s", "weight_sync_s", "other_s")}
    return {"build_algo_s": build_s, "iterations": len(rows), "mean_per_iteration": mean, "share_of_wall_time": split}


def demo(args) -> dict:
    from rllib_p3o.tasks import ArithmeticTask, build_demo_model
    from rllib_p3o.tasks.demo_config import demo_config

    model = build_demo_model(args.model_dir)
    config = demo_config(model, eval_interval=0, loss=args.loss)
    report = {
        "setting": "demo: 64 prompts x 8 completions, max_tokens 3, tiny Qwen2 (0.3M), 1 vLLM runner, "
        "local learner, 2 CPU cores",
        "loss": args.loss,
        **run_iterations(config, args.warmup, args.iterations),
    }
    prompts = [r["prompt"] for r in ArithmeticTask().train_rows()[: config.prompts_per_step]]
    report["generation_engines"] = _engine_benchmark(model, prompts, config.group_size, config.max_tokens, False)
    return report


def lengths(args) -> dict:
    from _bench_settings import GROUP_SIZE, LR, PROMPTS_PER_STEP, sum_reward, task_rows
    from _spread_model import build_length_model

    from rllib_p3o import P3OConfig

    report = {
        "setting": f"{args.size} spread-length model (completions of geometric length, mean = max_tokens), "
        f"{PROMPTS_PER_STEP} prompts x {GROUP_SIZE} completions, lr {LR}, 1 vLLM runner, local learner, 2 CPU cores",
        "loss": args.loss,
        "runs": {},
    }
    for max_tokens in args.max_tokens:
        model = build_length_model(args.size, max_tokens, args.models_dir)
        for mode in args.mode:
            config = (
                P3OConfig()
                .environment(env_config={"dataset": task_rows(), "reward_fn": sum_reward})
                .training(
                    model=model,
                    loss=args.loss,
                    group_size=GROUP_SIZE,
                    prompts_per_step=PROMPTS_PER_STEP,
                    max_tokens=max_tokens,
                    lr=LR,
                    eval_interval=0,
                    async_sampling=mode == "async",
                    max_staleness=1,
                )
                .env_runners(num_env_runners=1)
                .learners(num_learners=0)
                .debugging(seed=0)
            )
            label = f"<= {max_tokens} tokens, {mode}: "
            report["runs"][f"max_tokens={max_tokens}/{mode}"] = run_iterations(
                config, args.warmup, args.iterations, label
            )
        prompts = [r["prompt"] for r in task_rows()[:PROMPTS_PER_STEP]]
        report["runs"][f"max_tokens={max_tokens}/engines"] = _engine_benchmark(
            model, prompts, GROUP_SIZE, max_tokens, True, compiled=args.vllm_compiled
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument(
        "--loss", default="p3o", help="a registered loss (grpo_tis etc. also time π_old's recomputation)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model-dir", default="runs/demo/base_model")
    parser.add_argument("--max-tokens", nargs="+", type=int, help="the spread-length setting at these limits")
    parser.add_argument("--size", default="2.44M", help="model size of the spread-length setting")
    parser.add_argument("--mode", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--models-dir", default="runs/peer_trl")
    parser.add_argument(
        "--vllm-compiled",
        action="store_true",
        help="engine comparison: also vLLM's compiled model (enforce_eager=False)",
    )
    parser.add_argument("--out", help="default: results/benchmarks/iteration.json (iteration_lengths.json)")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    report = lengths(args) if args.max_tokens else demo(args)
    write_report(report, output_path(args))


def output_path(args: argparse.Namespace) -> str:
    """Where the report goes: ``--out``, else iteration.json (the demo) or iteration_lengths.json (``--max-tokens``)."""
    return args.out or f"results/benchmarks/iteration{'_lengths' if args.max_tokens else ''}.json"


if __name__ == "__main__":
    main()
