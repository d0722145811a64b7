"""vLLM worker extension: in-place weight reload that is correct on CPU and GPU.

Mixed into vLLM's worker class via ``LLM(worker_extension_cls="rllib_p3o.vllm_ext.WeightSyncExtension")`` and
called through ``llm.collective_rpc("p3o_reload_weights", args=(weights,))`` (`rllib_p3o.vllm_engine`). ``weights``
is ``{HF name: tensor}`` with the in-process engine (no copy on the way), or safetensors bytes with vLLM's
multiprocess engine (raw tensors only survive in-process).

Why not ``model.load_weights`` directly: on CPU, vLLM prepacks linear weights and drops the originals, so a direct
load corrupts the engine. The layerwise reload re-runs that post-processing. vLLM 0.32 has one more trap: with tied
embeddings the LM head keeps its *old* prepacked kernel after a reload; it is re-processed here.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Union


class WeightSyncExtension:
    def p3o_reload_weights(self, weights: Union[bytes, Mapping[str, Any]]) -> Dict[str, float]:
        import time

        t0 = time.perf_counter()
        if isinstance(weights, (bytes, bytearray)):
            import safetensors.torch

            weights = safetensors.torch.load(weights)
        self.reload_weights(weights_iterator=iter(weights.items()))
        self._p3o_refresh_tied_lm_head()
        return {"num_tensors": float(len(weights)), "engine_reload_s": time.perf_counter() - t0}

    def _p3o_refresh_tied_lm_head(self) -> None:
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        config = getattr(getattr(self, "model_config", None), "hf_config", None)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        quant_method = getattr(lm_head, "quant_method", None)
        if tied and quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(lm_head)
