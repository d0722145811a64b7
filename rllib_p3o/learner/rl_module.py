"""A TorchRLModule around any Hugging Face causal LM: per-token log-probs of a padded token batch.

Batch columns read by `_forward_train` (all right-padded to a common length ``T``):
    ``input_ids`` [B, T] int64 — prompt followed by completion;
    ``attention_mask`` [B, T] — 1 for real tokens (a right-padded batch runs without it: causal attention never
    reaches the padding after a row's real tokens; any other padding is masked as given).
Output: ``token_logp`` [B, T-1], where ``token_logp[:, t] = log π(input_ids[:, t+1] | input_ids[:, :t+1])``
(the log-prob of each *target* token), and ``token_entropy`` [B, T-1] when the module config asks for it.

The computation itself (the forward, the chunked LM head, length buckets or packing, optional ``torch.compile``) is
`rllib_p3o.learner.compute.TokenLogprobs`, which runs without Ray; this module holds the model and wraps it.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from ray.rllib.core.rl_module.torch import TorchRLModule

from rllib_p3o.core import lora
from rllib_p3o.core.columns import Columns
from rllib_p3o.core.precision import MODEL_DTYPE_PRECISION, RolloutWeights, autocast_dtype, compute_dtype
from rllib_p3o.core.settings import DEFAULT_FUSED_HEAD
from rllib_p3o.data.provenance import write_lineage
from rllib_p3o.learner.compute import (  # noqa: F401  (re-exported: the names' old home)
    DEFAULT_COMPILE,
    HEAD_CHUNKING_MIN_BYTES,
    LONGEST_ROW_POSITIONS,
    REAL_TOKENS,
    TOKEN_ENTROPY,
    TOKEN_LOGP,
    TOKEN_POSITIONS,
    TokenLogprobs,
    validate_options,
)

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with an explicit dtype and remote code off unless asked."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"model dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code)


class HFCausalLMRLModule(TorchRLModule):
    """RLModule holding ``self.lm``, an ``AutoModelForCausalLM``.

    ``model_config`` keys: ``model`` (local directory or hub id; required), ``dtype`` (of the weights: "float32" |
    "bfloat16" | "float16"), ``precision`` (`rllib_p3o.core.precision`; "bf16-mixed" runs the forward under bfloat16
    autocast), ``rollout_dtype`` and ``rollout_fp8_simulated`` (how the engines hold the weights, for
    `rollout_logprobs`), ``trust_remote_code`` (False), ``logprob_chunk_size`` (sequences per LM-head chunk, 8),
    ``compute_entropy`` (False; needed only for an entropy bonus), ``gradient_checkpointing`` (False),
    ``length_buckets`` (True), ``pack_sequences`` ("auto"), ``compile`` ("auto": on CUDA for a full-weight model
    without activation checkpointing), ``fused_head`` ("auto": off CUDA, the fused LM head where it serves the model
    and the logits would be chunked; "on" refused with ``compute_entropy``)
    (`rllib_p3o.learner.compute`), ``lora``
    (None, or a validated `rllib_p3o.core.lora` spec: ``self.lm`` is then a peft model whose adapter alone trains; the
    module state, the weight sync and checkpoints hold the adapter only, and the frozen base doubles as the
    reference model).
    """

    def setup(self) -> None:
        cfg = dict(self.model_config or {})
        if not cfg.get("model"):
            raise ValueError("HFCausalLMRLModule needs model_config['model']: a Hugging Face causal-LM directory.")
        validate_options(cfg)  # before the model loads: e.g. fused_head="on" with compute_entropy
        self.model_path: str = cfg["model"]
        dtype = cfg.get("dtype", "float32")
        self.lm = load_causal_lm(self.model_path, dtype, cfg.get("trust_remote_code", False))
        precision = cfg.get("precision") or MODEL_DTYPE_PRECISION.get(dtype, "fp32")
        # bf16-mixed: float32 weights here (and in the optimizer and checkpoints), bfloat16 compute.
        autocast = autocast_dtype(precision)
        self._param_dtype = dtype
        self.rollout_weights = RolloutWeights(
            cfg.get("rollout_dtype") or compute_dtype(precision), bool(cfg.get("rollout_fp8_simulated", False))
        )
        if cfg.get("gradient_checkpointing"):
            self.lm.gradient_checkpointing_enable()
        self.lora_spec: Optional[Dict[str, Any]] = cfg.get("lora")
        if self.lora_spec:
            from peft import get_peft_model

            self.lm = get_peft_model(self.lm, lora.peft_config(self.lora_spec))
        self.compute_entropy = bool(cfg.get("compute_entropy", False))
        # A plain object, not a submodule: the weights stay under ``self.lm`` (state-dict keys unchanged).
        self.core = TokenLogprobs(
            self.lm,
            autocast=autocast,
            chunk_size=int(cfg.get("logprob_chunk_size", 8)),
            length_buckets=cfg.get("length_buckets", True),
            pack_sequences=cfg.get("pack_sequences", "auto"),
            compile=cfg.get("compile", DEFAULT_COMPILE),
            fused_head=cfg.get("fused_head", DEFAULT_FUSED_HEAD),
            name=self.model_path,
        )

    # The core's settings, readable and settable here as before.
    @property
    def _autocast(self) -> Optional[torch.dtype]:
        return self.core.autocast

    @_autocast.setter
    def _autocast(self, value: Optional[torch.dtype]) -> None:
        self.core.autocast = value

    @property
    def bucket_call_cost(self) -> Optional[float]:
        return self.core.bucket_call_cost

    @bucket_call_cost.setter
    def bucket_call_cost(self, value: float) -> None:
        self.core.bucket_call_cost = value

    @property
    def head_chunking_min_bytes(self) -> int:
        return self.core.head_chunking_min_bytes

    @head_chunking_min_bytes.setter
    def head_chunking_min_bytes(self, value: int) -> None:
        self.core.head_chunking_min_bytes = value

    @property
    def _chunked_head_ok(self) -> bool:
        return self.core.chunked_head_ok

    # -- forward -------------------------------------------------------------------------------------------------

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self.token_logprobs(
            batch["input_ids"],
            batch["attention_mask"],
            with_entropy=self.compute_entropy,
            kept_ids=batch.get(Columns.KEPT_IDS),
        )

    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        # Used by RLlib's inference/exploration paths; rollouts are generated by vLLM, not here.
        return self.token_logprobs(batch["input_ids"], batch["attention_mask"], with_entropy=False)

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        with_entropy: bool = False,
        kept_ids: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """Log-prob (and optionally entropy) of every target token; see the module docstring for alignment. Under
        "bf16-mixed" the model runs under bfloat16 autocast; log-softmax and what follows run in float32. With
        ``kept_ids`` (top-k/top-p sampling) each renormalized over the sampler's kept set (`compute.kept_set_logprobs`)."""
        return self.core.token_logprobs(input_ids, attention_mask, with_entropy, kept_ids=kept_ids)

    def _causal_lm(self) -> torch.nn.Module:
        """The Hugging Face model (with the adapter's layers in it under LoRA): its ``base_model`` is the backbone."""
        return self.core.causal_lm()

    @torch.no_grad()
    def reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Log-probs under the frozen base: the same model with the adapter disabled (LoRA only)."""
        if not self.lora_spec:
            raise ValueError("reference_logprobs needs a LoRA module (else the learner loads the reference model)")
        with self.lm.disable_adapter():
            return self.token_logprobs(input_ids, attention_mask)[TOKEN_LOGP]

    @torch.no_grad()
    def sequence_logprobs(self, token_ids, autocast: bool = True) -> list:
        """Log-prob of each token of one sequence given its prefix, in eval mode (for weight-sync probes); without
        ``autocast`` in the weights' own dtype even under "bf16-mixed"."""
        was_training = self.training
        self.eval()
        try:
            ids = torch.as_tensor(token_ids, dtype=torch.long, device=next(self.parameters()).device)[None]
            if autocast:
                return self.token_logprobs(ids, torch.ones_like(ids))[TOKEN_LOGP][0].double().cpu().tolist()
            out = self.core.token_logprobs(ids, torch.ones_like(ids), autocast=False)
            return out[TOKEN_LOGP][0].double().cpu().tolist()
        finally:
            self.train(was_training)

    @torch.no_grad()
    def rollout_logprobs(self, token_ids) -> list:
        """Log-prob of each token of one sequence given its prefix, computed with the weights as the rollout engines
        hold them (`RolloutWeights`: cast to the rollout dtype and FP8-rounded if simulated) and in that dtype:
        the learner's side of the weight-sync probe, so that the check compares like with like in every precision
        and what is left is the engine's kernel numerics.

        Where the engines hold other weights than the module's (another dtype, FP8-rounded), the module's weights are
        swapped for those during the call (``torch.func.functional_call``): nothing else may use the module meanwhile
        (`rllib_p3o.sync.push` scores these on the driver's own thread)."""
        if not self.rollout_weights.changes(self._param_dtype):
            return self.sequence_logprobs(token_ids, autocast=False)
        was_training = self.lm.training
        self.lm.eval()
        try:
            # named_parameters lists a tied embedding/LM head once (functional_call refuses both names of a tie).
            weights = self.rollout_weights.apply({**dict(self.lm.named_parameters()), **dict(self.lm.named_buffers())})
            ids = torch.as_tensor(token_ids, dtype=torch.long, device=next(self.parameters()).device)[None]
            logits = torch.func.functional_call(
                self.lm, weights, args=(), kwargs={"input_ids": ids, "use_cache": False}
            )
            logp = F.log_softmax(logits.logits[0, :-1].float(), dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            return logp.double().cpu().tolist()
        finally:
            self.lm.train(was_training)

    # -- state ---------------------------------------------------------------------------------------------------

    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        # torch tensors, not numpy: numpy has no bfloat16, and fp16 would be silently upcast (2x sync payload).
        # Under LoRA the adapter only: the frozen base is the model directory (what syncs and checkpoints need).
        return {
            k: v.detach().cpu() for k, v in self.state_dict().items() if not self.lora_spec or lora.is_adapter_param(k)
        }

    def save_pretrained(self, path: str, tokenizer_from: Optional[str] = None, merged: bool = False) -> str:
        """Export the policy as a Hugging Face directory (weights, config and, if found, the tokenizer). Under LoRA:
        the adapter in peft format, or with ``merged`` the base with the adapter merged in (into a copy: the
        module's own base stays frozen and unmerged)."""
        os.makedirs(path, exist_ok=True)
        if self.lora_spec and merged:
            copy.deepcopy(self.lm).merge_and_unload().save_pretrained(path)
        else:
            self.lm.save_pretrained(path)
        try:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer_from or self.model_path).save_pretrained(path)
        except (OSError, ValueError) as e:
            logger.warning("No tokenizer saved with the model at %s: %s", path, e)
        # The models this one was trained from: a run that starts from it reads their recordings as its own.
        write_lineage(path, self.model_path)
        return path
