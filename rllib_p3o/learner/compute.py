"""The learner's compute core, importable without Ray or vLLM: token log-probs of a padded batch, and the loss call.

`TokenLogprobs` wraps a Hugging Face causal LM (or a peft model around one) and computes, for a right-padded token
batch ``input_ids`` [B, T] with ``attention_mask`` [B, T], ``token_logp`` [B, T-1] with
``token_logp[:, t] = log π(input_ids[:, t+1] | input_ids[:, :t+1])`` (and ``token_entropy`` when asked). How:

- **Rows of different lengths** run either in length buckets (`rllib_p3o.learner.length_buckets`: sorted by
  length, one forward pass per bucket trimmed to its longest row) or packed (`rllib_p3o.learner.packing`: the rows
  end to end in fewer rows, position ids restarting with each row, one forward pass). Either way the outputs come
  back in the batch's row order and width and equal those of a forward over the padded batch.
- **Packing** (``pack_sequences``): ``"auto"`` (default) packs on CUDA devices where the model and its attention
  backend keep packed sequences apart, checked on the model itself before first use (two rows packed must give the
  log-probs of the same rows padded); ``True`` packs on any device where that check passes; ``False`` never packs.
- **The bucket plan's call cost** (``length_buckets``): on a CPU `DEFAULT_CALL_COST_TOKENS`; elsewhere measured on
  the device before first use (`measure_call_cost`, counted twice: `planned_call_cost`; cached per device and
  model in this process), a failed or timed-out measurement counting as infinite (one padded pass); ``"measure"`` measures on any device, a number
  sets it, ``False`` runs every batch padded.
- **The LM head**: the full-vocabulary logits are the largest activation of LM training (B·T·V floats). The chunked
  head runs the head, log-softmax and gather per chunk of ``chunk_size`` sequences under activation checkpointing
  once the batch's float32 logits pass ``HEAD_CHUNKING_MIN_BYTES``; below that, once. The fused head
  (``fused_head``, `rllib_p3o.learner.fused_head`) computes the log-probs from the hidden states and the head's
  weight a token chunk at a time and never holds the logits of all tokens: ``"on"`` wherever it can serve the model
  (`fused_head_refusal`: a plain ``nn.Linear`` head whose output, soft-capped as the config says, is the model's
  logits; refused otherwise, and with entropies), ``"auto"`` (default) off CUDA where it can serve and the
  chunked head would chunk, ``"off"`` never.
- **Top-k/top-p sampling** (``kept_ids``, the sampler's kept set of each target, `rllib_p3o.core.columns.Columns`):
  each target's log-prob is renormalized over its kept set (`kept_set_logprobs`), so that the learner's log-prob and
  the sampler's processed log-prob are of the same truncated distribution.
- **torch.compile** (``compile``): each decoder layer is compiled with dynamic shapes (a new batch width reuses the
  compiled code instead of recompiling), when the core is first used on a device: ``"auto"`` (default) on CUDA for
  a model trained in all its weights without activation checkpointing, ``True`` on any device, ``False`` never.
- **The GPU default** (`resolve_compile`, `uses_fused_head`): on CUDA, ``"auto"`` packs, compiles and keeps the
  chunked head: of the paths measured on an H200 (``benchmarks/gpu_session.sh``, `results/benchmarks/gpu_session`),
  packed and compiled with the chunked head was the fastest exact one at both shapes and both batch sizes; the
  fused head is faster only on a CPU, and on a GPU it is chosen for memory (``fused_head="on"``).

`compute_loss` calls a registered loss (`rllib_p3o.core.losses`) on the outputs. The RLModule
(`rllib_p3o.learner.rl_module`) and the Learner (`rllib_p3o.learner.p3o_torch_learner`) wrap both;
``benchmarks/learner_gpu.py`` runs them without Ray.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rllib_p3o.core.columns import KEPT_OVERFLOW
from rllib_p3o.core.losses import LossInputs, LossOutput, LossSpec
from rllib_p3o.core.settings import DEFAULT_FUSED_HEAD, FUSED_HEAD_MODES
from rllib_p3o.learner.fused_head import DEFAULT_CHUNK_TOKENS, fused_token_logprobs
from rllib_p3o.learner.length_buckets import (
    DEFAULT_CALL_COST_TOKENS,
    MEASURE_BUDGET_S,
    MEASURE_ROWS,
    MEASURE_WIDTHS,
    bucket_call_cost,
    measure_call_cost,
    plan_buckets,
    planned_call_cost,
)
from rllib_p3o.learner.packing import (
    MASKED_ATTENTION,
    VARLEN_ATTENTION,
    pack_capacity,
    pack_rows,
    pack_target_values,
    plan_packing,
)
from rllib_p3o.learner.packing import unpack_token_values as unpack

logger = logging.getLogger(__name__)

TOKEN_LOGP = "token_logp"
TOKEN_ENTROPY = "token_entropy"
# Token positions the forward pass computed and real tokens among them (floats; for the learner's padding metric).
TOKEN_POSITIONS = "token_positions"
REAL_TOKENS = "real_tokens"
# What padding every row to the batch's longest would have computed (for the padding share without buckets).
LONGEST_ROW_POSITIONS = "longest_row_positions"

# Full-batch float32 logits below this size are computed in one piece, without chunks or recomputation.
HEAD_CHUNKING_MIN_BYTES = 64 * 2**20
# ``compile`` in an RLModule's model_config (`resolve_compile`): compiled on CUDA for a full-weight model.
DEFAULT_COMPILE = "auto"
# The packing check (`TokenLogprobs._check_packing`): how far packed log-probs may sit from padded ones, by the
# compute dtype (float32: kernel-order differences; half precision: a rounding of the logits).
PACKING_CHECK_ATOL = {torch.float32: 1e-4, torch.float64: 1e-8}
PACKING_CHECK_ATOL_HALF = 5e-2

# Measured call costs, per device and model (`TokenLogprobs._cache_key`).
_CALL_COST_CACHE: Dict[Tuple[Any, ...], Optional[float]] = {}

# Why fused_head="on" cannot run where entropies are asked for.
ENTROPY_REFUSAL = (
    "fused_head='on' computes log-probs only, and an entropy bonus needs each token's entropy over the whole "
    "vocabulary; use fused_head='auto' (the chunked head where entropies are asked for) or 'off'"
)


def validate_options(model_config: Mapping[str, Any]) -> None:
    """ValueError for a bad ``length_buckets``, ``pack_sequences``, ``compile`` or ``fused_head`` in an RLModule
    ``model_config``, or ``fused_head="on"`` with ``compute_entropy`` (the fused head computes no entropy)."""
    bucket_call_cost(model_config.get("length_buckets", True))
    pack = model_config.get("pack_sequences", "auto")
    if not (pack is True or pack is False or pack == "auto"):
        raise ValueError(f"pack_sequences must be 'auto', True or False, got {pack!r}")
    compile_setting = model_config.get("compile", DEFAULT_COMPILE)
    if not (compile_setting is True or compile_setting is False or compile_setting == "auto"):
        raise ValueError(f"compile must be 'auto', True or False, got {compile_setting!r}")
    fused = model_config.get("fused_head", DEFAULT_FUSED_HEAD)
    if not isinstance(fused, str) or fused not in FUSED_HEAD_MODES:
        raise ValueError(f"fused_head must be one of {', '.join(map(repr, FUSED_HEAD_MODES))}, got {fused!r}")
    if fused == "on" and model_config.get("compute_entropy"):
        raise ValueError(ENTROPY_REFUSAL)


def resolve_compile(
    setting: Union[bool, str], device: torch.device, adapter: bool, checkpointing: bool = False
) -> bool:
    """Whether the decoder layers are compiled on ``device``: ``True``/``False`` as set; ``"auto"`` where it was
    measured the fastest exact path (an H200: `results/benchmarks/gpu_session`): on CUDA, for a model trained in all
    its weights without activation checkpointing. Eager elsewhere: a peft model (``adapter``) and checkpointed layers
    (``checkpointing``), whose compiled steps were not measured, and other devices (inductor's C++ builds take minutes
    on a small CPU, and the CPU paths were tuned eager)."""
    if setting == "auto":
        return device.type == "cuda" and not adapter and not checkpointing
    return bool(setting)


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether each row's real tokens come first: under causal attention no real token then attends to the padding
    after it, so the mask changes nothing the loss reads, and without one the model runs its plain causal attention
    (forward+backward 6% faster at 2.44M parameters on CPU)."""
    real = attention_mask.bool()
    return bool((real[:, 1:] <= real[:, :-1]).all())


def _softcap(logits: torch.Tensor, cap: Optional[float]) -> torch.Tensor:
    return logits if not cap else torch.tanh(logits / cap) * cap


def kept_set_log_mass(logp_all: torch.Tensor, kept_ids: torch.Tensor) -> torch.Tensor:
    """``log Σ_{v ∈ K} π(v)`` at each position, from the full log-probs ``logp_all`` [..., V] and the kept set's ids
    ``kept_ids`` [..., W] (negative ids: padding, or the `KEPT_OVERFLOW` mark); 0 where a position has no kept set
    (sampled untruncated, or its set overflowed the record), i.e. the full distribution there."""
    valid = kept_ids >= 0
    has_set = valid.any(-1) & (kept_ids[..., 0] != KEPT_OVERFLOW)
    picked = logp_all.gather(-1, kept_ids.clamp(min=0).long()).masked_fill(~valid, float("-inf"))
    # Positions without a set sum zeros instead of -inf only: logsumexp of all -inf has a NaN gradient.
    picked = torch.where(has_set.unsqueeze(-1), picked, torch.zeros_like(picked))
    return torch.where(has_set, torch.logsumexp(picked, dim=-1), torch.zeros_like(picked[..., 0]))


def kept_set_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, kept_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-prob of each target under the distribution truncated to the sampler's kept set K and renormalized:

        logp_K(y) = z_y − logsumexp_{v ∈ K} z_v,    z = logits / temperature,

    i.e. ``log softmax(z)[y] − log Σ_{v ∈ K} softmax(z)[v]``. vLLM's processed log-prob of a token sampled with
    top-k/top-p is this, at the sampler's weights and temperature (it divides by the temperature, masks the logits
    outside K with -inf and takes the log-softmax: ``vllm.v1.sample.sampler``); so at equal weights and temperature
    the ratio of the two is exactly 1. ``logits`` [..., V], ``targets`` [...], ``kept_ids`` [..., W] (padding:
    negative ids; positions without a kept set: the full distribution's log-prob). The learner calls it with its own
    temperature, 1 (a rollout at T ≠ 1 stays off-policy data, as without truncation)."""
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp - kept_set_log_mass(logp_all, kept_ids)


def head_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool, kept_ids: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(logits)[target]`` (renormalized over ``kept_ids`` where given: `kept_set_logprobs`) and the
    entropy ``-Σ p log p`` of the full distribution (zeros unless asked), in float32."""
    logp_all = F.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if kept_ids is not None:
        logp = logp - kept_set_log_mass(logp_all, kept_ids)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return logp, ent


def kept_set_overflow(kept_ids: Optional[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Where ``mask``'s targets had a kept set larger than the runner recorded (`KEPT_OVERFLOW`): their log-probs
    cannot be renormalized exactly, so the learner leaves them out of the loss."""
    if kept_ids is None or kept_ids.shape[-1] == 0:
        return torch.zeros_like(mask)
    return mask & (kept_ids[..., 0] == KEPT_OVERFLOW)


class TokenLogprobs:
    """Token log-probs of a Hugging Face causal LM ``lm`` (a peft model is unwrapped for its backbone); see the module
    docstring. ``autocast``: the dtype of mixed-precision compute (None: the weights' own). The options are the
    RLModule's ``model_config`` keys of the same names. ``clock`` times the call-cost measurement (tests fake it)."""

    def __init__(
        self,
        lm: torch.nn.Module,
        *,
        autocast: Optional[torch.dtype] = None,
        chunk_size: int = 8,
        length_buckets: Union[bool, float, str] = True,
        pack_sequences: Union[bool, str] = "auto",
        compile: Union[bool, str] = DEFAULT_COMPILE,
        fused_head: str = DEFAULT_FUSED_HEAD,
        measure_budget_s: float = MEASURE_BUDGET_S,
        clock: Callable[[], float] = time.perf_counter,
        name: str = "model",
    ) -> None:
        validate_options(
            {
                "length_buckets": length_buckets,
                "pack_sequences": pack_sequences,
                "compile": compile,
                "fused_head": fused_head,
            }
        )
        self.lm = lm
        self.autocast = autocast
        self.chunk_size = int(chunk_size)
        self.length_buckets = length_buckets
        self.pack_sequences = pack_sequences
        self.compile = compile
        self.measure_budget_s = measure_budget_s
        self.clock = clock
        self.name = name
        self.head_chunking_min_bytes = HEAD_CHUNKING_MIN_BYTES
        self._softcap = getattr(self.causal_lm().config, "final_logit_softcapping", None)
        self.chunked_head_ok = self._check_chunked_head()
        self.fused_head = fused_head
        self.fused_chunk_tokens = DEFAULT_CHUNK_TOKENS
        # Why the fused head cannot serve this model (None: it can); "on" refuses such a model, "auto" keeps the
        # chunked head for it.
        self.fused_head_refusal = self._fused_head_refusal()
        if self.fused_head_refusal and fused_head == "on":
            raise ValueError(
                f"fused_head='on' cannot serve {name}: {self.fused_head_refusal}; use fused_head='auto' (the chunked "
                "head where the fused one cannot serve) or 'off'"
            )
        if self.fused_head_refusal and fused_head == "auto":
            logger.info("The chunked LM head for %s: %s.", name, self.fused_head_refusal)
        self.packing = False  # resolved per device by `prepare`
        self._call_cost: Optional[float] = None
        self._call_cost_set = False  # set through `bucket_call_cost`: never measured over
        self._prepared_for: Optional[torch.device] = None
        self._compiled: List[torch.nn.Module] = []

    # -- options resolved on the device ------------------------------------------------------------------------

    @property
    def bucket_call_cost(self) -> Optional[float]:
        """The bucket plan's call cost in token positions (None until resolved on a device, or while packing)."""
        return self._call_cost

    @bucket_call_cost.setter
    def bucket_call_cost(self, value: float) -> None:
        self._call_cost = float(value)
        self._call_cost_set = True

    def prepare(self, device: Union[torch.device, str]) -> None:
        """Resolve the options on ``device`` (where the weights are): compile, check packing, and measure the call
        cost when the bucket plan will need it. Done once per device; `token_logprobs` calls it, a learner calls it
        when it starts (before its first step, so that nothing is timed inside a training step)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one device
            device = torch.device("cuda", torch.cuda.current_device())
        if self._prepared_for == device:
            return
        self._prepared_for = device
        lm = self.causal_lm()
        checkpointing = bool(getattr(lm, "is_gradient_checkpointing", False))
        if resolve_compile(self.compile, device, self.lm is not lm, checkpointing) and not self._compiled:
            self._compile()
        wants_packing = self.pack_sequences is True or (self.pack_sequences == "auto" and device.type == "cuda")
        self.packing = wants_packing and self._check_packing(device)
        if not self._call_cost_set:
            self._call_cost = None if self.packing else self._resolve_call_cost(device)

    def _resolve_call_cost(self, device: torch.device) -> float:
        setting = bucket_call_cost(self.length_buckets)
        if setting is not None and (self.length_buckets is not True or device.type == "cpu"):
            return setting
        key = self._cache_key(device)
        if key not in _CALL_COST_CACHE:
            _CALL_COST_CACHE[key] = self._measure_call_cost(device)
        measured = _CALL_COST_CACHE[key]
        if measured is None:  # no measurement in time: a CPU keeps its default, elsewhere one padded pass
            return DEFAULT_CALL_COST_TOKENS if device.type == "cpu" else float("inf")
        return planned_call_cost(measured)

    def _cache_key(self, device: torch.device) -> Tuple[Any, ...]:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        lm = self.causal_lm()
        params = sum(p.numel() for p in self.lm.parameters())
        trainable = sum(p.numel() for p in self.lm.parameters() if p.requires_grad)
        attn = getattr(lm.config, "_attn_implementation", None)
        checkpointing = bool(getattr(lm, "is_gradient_checkpointing", False))
        return (
            str(device),
            name,
            type(lm).__name__,
            params,
            trainable,
            attn,
            self.autocast,
            self.compile,
            checkpointing,
            self.fused_head,
        )

    def _measure_call_cost(self, device: torch.device) -> Optional[float]:
        """`measure_call_cost` with forward+backward passes of this model on random tokens (the gradients they leave
        are discarded: the parameters' ``.grad`` are as before)."""
        config = self.causal_lm().config
        longest = min(MEASURE_WIDTHS[1], int(getattr(config, "max_position_embeddings", MEASURE_WIDTHS[1])))
        widths = (max(2, longest // 4), longest)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (MEASURE_ROWS, longest), generator=generator).to(device)
        params = [p for p in self.lm.parameters() if p.requires_grad]
        saved = [p.grad for p in params]

        def run_pass(rows: int, width: int) -> None:
            with torch.enable_grad(), self._autocast_context(device):
                logp = self._forward_rows(ids[:rows, :width], None, None, False)[TOKEN_LOGP]
            if logp.requires_grad:
                logp.sum().backward()
            for p in params:
                p.grad = None

        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        try:
            cost = measure_call_cost(
                run_pass, MEASURE_ROWS, widths, budget_s=self.measure_budget_s, clock=self.clock, sync=sync
            )
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # e.g. out of memory: plan conservatively
            logger.warning("Measuring the forward pass's call cost of %s failed (%s).", self.name, e)
            cost = None
        finally:
            for p, g in zip(params, saved):
                p.grad = g
        logger.info("Call cost of one forward pass of %s on %s: %s token positions.", self.name, device, cost)
        return cost

    def _compile(self) -> None:
        """``torch.compile`` each decoder layer (in place, dynamic shapes); the whole backbone if it has no layer
        list. Layers rather than the model: the model's mask building and head stay eager (they break graphs)."""
        base = self.causal_lm().base_model
        layers = getattr(base, "layers", None)
        modules = list(layers) if isinstance(layers, torch.nn.ModuleList) else [base]
        for module in modules:
            module.compile(dynamic=True)
        self._compiled = modules

    def uncompile(self) -> None:
        """Undo `compile` (the layers run eagerly again; for benchmarks that compare both on one model)."""
        for module in self._compiled:
            module._compiled_call_impl = None
        self._compiled = []
        self.compile = False
        self._prepared_for = None

    @torch.no_grad()
    def _check_packing(self, device: torch.device) -> bool:
        """Whether packed rows give this model's padded log-probs on ``device``: the attention implementation is one
        that separates packed sequences (`rllib_p3o.learner.packing`), and two rows packed match them padded."""
        attn = getattr(self.causal_lm().config, "_attn_implementation", None)
        if attn not in MASKED_ATTENTION + VARLEN_ATTENTION:
            logger.warning("Packing off for %s: attention %r may not separate packed sequences.", self.name, attn)
            return False
        if attn in MASKED_ATTENTION:
            from transformers import masking_utils

            if not hasattr(masking_utils, "find_packed_sequence_indices"):
                logger.warning("Packing off: this transformers does not build masks for packed sequences.")
                return False
        vocab = self.causal_lm().config.vocab_size
        ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0)).to(device)
        lengths = np.array([12, 7])
        mask = (torch.arange(12, device=device)[None] < torch.as_tensor(lengths, device=device)[:, None]).long()
        was_training = self.lm.training
        self.lm.eval()
        try:
            with self._autocast_context(device):
                padded = self._forward_rows(ids, None, None, False)[TOKEN_LOGP]
                packed = self._packed(ids, lengths, False, capacity=int(lengths.sum()))[0][TOKEN_LOGP]
        except Exception as e:  # a model or backend that refuses position ids or the packed mask
            logger.warning("Packing off for %s: the packed forward failed (%s).", self.name, e)
            return False
        finally:
            self.lm.train(was_training)
        valid = mask[:, 1:].bool()
        compute = self.autocast or next(self.lm.parameters()).dtype
        atol = PACKING_CHECK_ATOL.get(compute, PACKING_CHECK_ATOL_HALF)
        gap = float((packed - padded)[valid].abs().max())
        if not gap <= atol:
            logger.warning("Packing off for %s: packed log-probs differ from padded ones by %.2g.", self.name, gap)
        return gap <= atol

    # -- forward -----------------------------------------------------------------------------------------------

    def causal_lm(self) -> torch.nn.Module:
        """The Hugging Face model (with the adapter's layers in it under peft): its ``base_model`` is the backbone."""
        return self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm

    def _autocast_context(self, device: torch.device):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast)

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        with_entropy: bool = False,
        autocast: bool = True,
        kept_ids: Optional[torch.Tensor] = None,
    ) -> Dict[str, Any]:
        """Log-prob (and optionally entropy) of every target token, plus the position counts of the padding metric
        (`TOKEN_POSITIONS`, `REAL_TOKENS`, `LONGEST_ROW_POSITIONS`). Under ``autocast`` (a mixed precision) the model
        runs under that dtype's autocast; log-softmax and what follows run in float32. ``kept_ids`` [B, T-1, W]: the
        sampler's kept sets under top-k/top-p, each target's log-prob renormalized over its own (`kept_set_logprobs`)."""
        self.prepare(input_ids.device)
        if kept_ids is not None:
            kept_ids = torch.as_tensor(kept_ids, device=input_ids.device).long() if kept_ids.shape[-1] else None
        context = self._autocast_context(input_ids.device) if autocast else contextlib.nullcontext()
        with context:
            return self._token_logprobs(input_ids, attention_mask, with_entropy, kept_ids)

    def _token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        with_entropy: bool,
        kept_ids: Optional[torch.Tensor] = None,
    ) -> Dict[str, Any]:
        input_ids = input_ids.long()
        rows, width = input_ids.shape
        if not is_right_padded(attention_mask):  # (never from our batching): the whole batch, masked as given
            out: Dict[str, Any] = self._forward_rows(input_ids, attention_mask, None, with_entropy, kept_ids)
            real = float(attention_mask.sum())
            out.update({TOKEN_POSITIONS: float(rows * width), REAL_TOKENS: real, LONGEST_ROW_POSITIONS: rows * width})
            return out
        lengths = attention_mask.sum(-1).clamp(min=2).cpu().numpy()
        if self.packing:
            capacity = pack_capacity(lengths, getattr(self.causal_lm().config, "_attn_implementation", ""))
            out, positions = self._packed(input_ids, lengths, with_entropy, capacity, kept_ids)
        else:
            if self._call_cost is None:
                self._call_cost = self._resolve_call_cost(input_ids.device)
            out, positions = self._bucketed(input_ids, lengths, with_entropy, kept_ids)
        out[TOKEN_POSITIONS] = float(positions)
        out[REAL_TOKENS] = float(lengths.sum())
        out[LONGEST_ROW_POSITIONS] = float(rows * lengths.max())
        return out

    def _bucketed(
        self, input_ids: torch.Tensor, lengths: np.ndarray, with_entropy: bool, kept_ids: Optional[torch.Tensor] = None
    ) -> Tuple[Dict[str, Any], int]:
        """One forward pass per length bucket, outputs back in the batch's row order and width."""
        width = input_ids.shape[1]
        buckets = plan_buckets(lengths, self._call_cost)
        parts = []
        for bucket in buckets:
            index = torch.as_tensor(bucket.rows, device=input_ids.device)
            kept = None if kept_ids is None else kept_ids[index, : bucket.width - 1]
            part = self._forward_rows(input_ids[index, : bucket.width], None, None, with_entropy, kept)
            parts.append({k: F.pad(v, (0, width - bucket.width)) for k, v in part.items()})
        # Back to the batch's row order: each row's outputs depend on that row alone, so this equals the padded pass.
        order = torch.as_tensor(np.concatenate([b.rows for b in buckets]), device=input_ids.device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=order.device)
        out = {k: torch.cat([p[k] for p in parts])[inverse] for k in parts[0]}
        return out, sum(len(b.rows) * b.width for b in buckets)

    def _packed(
        self,
        input_ids: torch.Tensor,
        lengths: np.ndarray,
        with_entropy: bool,
        capacity: int,
        kept_ids: Optional[torch.Tensor] = None,
    ) -> Tuple[Dict[str, Any], int]:
        """One forward pass over the rows packed into rows of ``capacity`` positions, outputs unpacked."""
        plan = plan_packing(lengths, capacity)
        packed_ids, position_ids = pack_rows(input_ids, plan)
        kept = None if kept_ids is None else pack_target_values(kept_ids, plan, fill=-1)
        part = self._forward_rows(packed_ids, None, position_ids, with_entropy, kept)
        return {k: unpack(v, plan, input_ids.shape[1]) for k, v in part.items()}, plan.token_positions

    def _forward_rows(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        position_ids: Optional[torch.Tensor],
        with_entropy: bool,
        kept_ids: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """Log-probs (and entropies) of every target token of these rows, in one forward pass of the model (renormalized
        over ``kept_ids`` [rows, width - 1, W] where given)."""
        targets = input_ids[:, 1:]
        lm = self.causal_lm()
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if self.chunked_head_ok:
            hidden = lm.base_model(**inputs).last_hidden_state[:, :-1]
            if self.uses_fused_head(hidden.shape[0] * hidden.shape[1], with_entropy):
                return {TOKEN_LOGP: self._fused_head(hidden, targets, kept_ids)}
            head = self._head_from_hidden
            vocab = lm.get_output_embeddings().weight.shape[0]
        else:
            hidden = self.lm(**inputs).logits[:, :-1]
            head = head_from_logits
            vocab = hidden.shape[-1]
        logits_bytes = 4 * hidden.shape[0] * hidden.shape[1] * vocab
        chunk = self.chunk_size if logits_bytes >= self.head_chunking_min_bytes else hidden.shape[0]
        logps, ents = [], []
        for s in range(0, hidden.shape[0], chunk):
            h, y = hidden[s : s + chunk], targets[s : s + chunk]
            k = None if kept_ids is None else kept_ids[s : s + chunk]
            if chunk < hidden.shape[0] and torch.is_grad_enabled() and h.requires_grad:
                lp, ent = checkpoint(head, h, y, with_entropy, k, use_reentrant=False)
            else:
                lp, ent = head(h, y, with_entropy, k)
            logps.append(lp)
            ents.append(ent)
        out = {TOKEN_LOGP: torch.cat(logps)}
        if with_entropy:
            out[TOKEN_ENTROPY] = torch.cat(ents)
        return out

    def _head_from_hidden(
        self, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool, kept_ids: Optional[torch.Tensor] = None
    ):
        logits = self.causal_lm().get_output_embeddings()(hidden)
        return head_from_logits(_softcap(logits, self._softcap), targets, with_entropy, kept_ids)

    def uses_fused_head(self, tokens: int, with_entropy: bool = False) -> bool:
        """Whether a forward pass over ``tokens`` target positions takes the fused head (``fused_head``): "on" always
        (refusing entropies), "auto" off CUDA where the chunked head would chunk (the float32 logits of those tokens
        reach ``head_chunking_min_bytes``) and no entropy is asked for, never under "off", under "auto" on CUDA, or
        where the fused head cannot serve the model (`fused_head_refusal`)."""
        if self.fused_head == "off" or self.fused_head_refusal is not None:
            return False
        if with_entropy:
            if self.fused_head == "on":
                raise ValueError(ENTROPY_REFUSAL)
            return False
        if self.fused_head == "on":
            return True
        if self._prepared_for is not None and self._prepared_for.type == "cuda":
            return False  # "auto" on a GPU: the chunked head, faster there (the module docstring's GPU default)
        vocab = self.causal_lm().get_output_embeddings().weight.shape[0]
        return 4 * tokens * vocab >= self.head_chunking_min_bytes

    def _fused_head(
        self, hidden: torch.Tensor, targets: torch.Tensor, kept_ids: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """Token log-probs [rows, width] from ``hidden`` [rows, width, H] by the fused head (`fused_token_logprobs`:
        ``fused_chunk_tokens`` tokens at a time, the model's soft-cap), renormalized over ``kept_ids`` where given."""
        head = self.causal_lm().get_output_embeddings()
        logp = fused_token_logprobs(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            targets.reshape(-1),
            bias=head.bias,
            kept_ids=None if kept_ids is None else kept_ids.reshape(-1, kept_ids.shape[-1]),
            chunk_tokens=self.fused_chunk_tokens,
            softcap=self._softcap,
        )
        return logp.view(targets.shape)

    def _fused_head_refusal(self) -> Optional[str]:
        """Why the fused head cannot stand in for this model's head, or None. It reads the head's weight and bias and
        applies ``cap·tanh(x / cap)`` itself, so it needs (1) the model's logits to be ``lm_head(h)`` soft-capped by
        ``final_logit_softcapping`` (`_check_chunked_head`: a logit scale or another soft-cap fails it) and (2) the
        head to be a plain ``nn.Linear`` without hooks (an adapter, a quantized layer or a hook adds what the
        weight alone does not hold)."""
        if not self.chunked_head_ok:
            return (
                "its logits are not lm_head(last hidden state), soft-capped as cap·tanh(x / cap) by "
                "final_logit_softcapping where set, as checked on the model at start (its forward scales or "
                "soft-caps them otherwise, or it has no separable backbone)"
            )
        head = self.causal_lm().get_output_embeddings()
        if type(head) is not torch.nn.Linear:
            return (
                f"its LM head is a {type(head).__module__}.{type(head).__qualname__}, not a plain torch.nn.Linear "
                "(the fused head reads the weight and bias alone, which would skip what that layer adds)"
            )
        if head._forward_hooks or head._forward_pre_hooks:
            return "its LM head has forward hooks, which the fused head would skip"
        return None

    @torch.no_grad()
    def _check_chunked_head(self) -> bool:
        """Whether ``lm_head(base_model(x))`` reproduces the model's own logits for this architecture.

        Some architectures scale or post-process logits in their ``forward``; for those we fall back to the
        model's full forward (correct, but without the memory saving) rather than computing wrong log-probs.
        """
        lm = self.causal_lm()
        try:
            device = next(self.lm.parameters()).device
            ids = torch.arange(8, dtype=torch.long, device=device).remainder(lm.config.vocab_size).unsqueeze(0)
            mask = torch.ones_like(ids)
            was_training = self.lm.training
            self.lm.eval()
            ref = self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
            hid = lm.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            mine = _softcap(lm.get_output_embeddings()(hid), self._softcap).float()
            self.lm.train(was_training)
            ok = bool(torch.allclose(ref, mine, atol=1e-4, rtol=1e-3))
        except Exception as e:  # an architecture without base_model/last_hidden_state
            logger.warning("Chunked LM head unavailable for %s (%s); using full logits.", self.name, e)
            return False
        if not ok:
            logger.warning("lm_head(base_model(x)) differs from %s's logits; using full logits.", self.name)
        return ok


def compute_loss(
    spec: LossSpec,
    settings: Any,
    fwd_out: Mapping[str, Any],
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **optional: Any,
) -> LossOutput:
    """The registered loss ``spec`` (with its ``settings``) on the forward's outputs: ``LossInputs`` from
    ``fwd_out``'s log-probs (and entropies) and the batch's columns; ``optional``: the other `LossInputs` fields
    (``ref_logprobs``, ``kl_ref_coeff``, ``entropy_coeff``, ``ess_groups``, ``num_ess_groups``, ``old_logprobs``)."""
    inputs = LossInputs(
        fwd_out[TOKEN_LOGP], behavior_logprobs, advantages, mask, entropy=fwd_out.get(TOKEN_ENTROPY), **optional
    )
    return spec.fn(inputs, settings)
