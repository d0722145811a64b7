"""vLLM worker extension: in-place weight reload that is correct on CPU and GPU.

Mixed into vLLM's worker class via ``LLM(worker_extension_cls="rllib_p3o.runner.vllm_ext.WeightSyncExtension")`` and
called through ``llm.collective_rpc("p3o_reload_weights", args=(weights,))`` (`rllib_p3o.runner.vllm_engine`). ``weights``
is ``{HF name: tensor}`` with the in-process engine (no copy on the way), or safetensors bytes with vLLM's
multiprocess engine (raw tensors only survive in-process).

Why not ``model.load_weights`` directly: on CPU, vLLM prepacks linear weights and drops the originals, so a direct
load corrupts the engine. The layerwise reload re-runs that post-processing. vLLM 0.32 has one more trap: with tied
embeddings the LM head keeps its *old* prepacked kernel after a reload; it is re-processed here.

vLLM's layerwise reload warns "<Layer>: Failed to load weights" for every layer the payload holds no tensor for, at
every sync. Two such layers are expected and harmless, and their warnings are dropped at the source
(`_ExpectedReloadGaps`): the rotary embeddings, whose cos/sin cache is computed from the config and is never in a
checkpoint (vLLM puts the cache back as it was); and, with tied embeddings, the LM head, which shares the embedding's
weight (left out of the payload on purpose) and is re-processed here. Any other layer still warns: a tensor
missing from the payload would leave that layer's old weights in the engine (the probe check would also fail).

LoRA (`p3o_load_lora`): vLLM loads adapters only from files named by a ``LoRARequest``; this builds the adapter from
the tensors the runner received and puts it in the worker's adapter manager under the request's id, which vLLM then
finds loaded and never reads from a path. The previous version is removed first (one policy adapter at a time).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, Iterator, List, Mapping, Union

# vLLM's logger of the layerwise reload, and its message for a layer that got no tensor.
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
FAILED_TO_LOAD = "%s: Failed to load weights"


class _ExpectedReloadGaps(logging.Filter):
    """Drops vLLM's "Failed to load weights" warning for the layers whose weights a sync leaves out on purpose (see
    the module docstring): rotary embeddings always, the LM head with tied embeddings."""

    def __init__(self, tied_embeddings: bool):
        super().__init__()
        self.tied_embeddings = tied_embeddings

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != FAILED_TO_LOAD or not record.args:
            return True
        layer = str(record.args[0])
        return not (layer.endswith("RotaryEmbedding") or (self.tied_embeddings and layer == "ParallelLMHead"))


@contextlib.contextmanager
def _expected_reload_gaps_quiet(tied_embeddings: bool) -> Iterator[None]:
    log = logging.getLogger(LAYERWISE_LOGGER)
    quiet = _ExpectedReloadGaps(tied_embeddings)
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


class WeightSyncExtension:
    def p3o_reload_weights(self, weights: Union[bytes, Mapping[str, Any]]) -> Dict[str, float]:
        import time

        t0 = time.perf_counter()
        weights = _tensors(weights)
        with _expected_reload_gaps_quiet(self._p3o_tied_embeddings()):
            self.reload_weights(weights_iterator=iter(weights.items()))
        self._p3o_refresh_tied_lm_head()
        return {"num_tensors": float(len(weights)), "engine_reload_s": time.perf_counter() - t0}

    def p3o_load_lora(
        self, lora_id: int, weights: Union[bytes, Mapping[str, Any]], r: int, alpha: float, target_modules: List[str]
    ) -> Dict[str, float]:
        """Make ``weights`` (peft names, `rllib_p3o.core.lora.adapter_state`) the adapter with id ``lora_id``."""
        import time

        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        t0 = time.perf_counter()
        weights = _tensors(weights)
        worker_manager = self.model_runner.lora_manager
        manager = worker_manager._adapter_manager
        helper = PEFTHelper.from_dict({"r": r, "lora_alpha": alpha, "target_modules": list(target_modules)})
        helper.validate_legal(worker_manager.lora_config)
        mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
        # Cloned: vLLM scales lora_B in place, and the received tensors may be the learner's own or read-only.
        lora = LoRAModel.from_lora_tensors(
            lora_id,
            {k: v.detach().clone() for k, v in weights.items()},
            helper,
            device="cpu",
            dtype=worker_manager.lora_config.lora_dtype,
            model_vocab_size=worker_manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        )
        if not lora.loras:
            raise ValueError(f"none of the {len(weights)} adapter tensors matched a LoRA layer of the engine's model")
        for old in list(manager.list_adapters()):
            manager.remove_adapter(old)
        manager.add_adapter(lora)
        manager.activate_adapter(lora_id)
        return {"num_tensors": float(len(weights)), "engine_reload_s": time.perf_counter() - t0}

    def _p3o_tied_embeddings(self) -> bool:
        config = getattr(getattr(self, "model_config", None), "hf_config", None)
        return bool(getattr(config, "tie_word_embeddings", False))

    def _p3o_refresh_tied_lm_head(self) -> None:
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        tied = self._p3o_tied_embeddings()
        quant_method = getattr(lm_head, "quant_method", None)
        if tied and quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(lm_head)


def _tensors(weights: Union[bytes, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The tensors of a reload argument: as given in-process, or read from safetensors bytes (multiprocess)."""
    if isinstance(weights, (bytes, bytearray)):
        import safetensors.torch

        return safetensors.torch.load(weights)
    return weights
