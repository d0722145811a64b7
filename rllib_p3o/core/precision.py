"""Precision of the learner and of the rollouts: names, dtypes, and the weights as the rollout engines hold them.

Learner precision (``training(precision=...)``):

    fp32        float32 weights, optimizer state and compute (the default)
    bf16-mixed  float32 master weights and optimizer state, forward and backward under bfloat16 autocast (as
                production trainers run); checkpoints hold the float32 weights
    bf16        bfloat16 weights, optimizer state and compute ("pure" bf16; Adam then updates bfloat16 weights)
    fp16        float16 likewise

Rollout precision: the engines run in ``rollout_dtype`` (default: the learner's compute dtype), and with
``rollout_quantization`` their linear weights are FP8: vLLM's own FP8 quantization on GPU (``"fp8"``), or on any
machine a simulation (``"fp8_simulated"``) that rounds every linear weight through ``float8_e4m3fn`` with one scale
per output channel before the weights are loaded; the engine then computes in ``rollout_dtype``. The learner's
weights are cast (and rounded) the same way before every sync (`RolloutWeights.apply`), so the behavior log-probs
are the engine's and the importance ratio carries the precision gap, as in production.

Pure torch.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional

import torch

PRECISIONS = ("fp32", "bf16-mixed", "bf16", "fp16")
DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROLLOUT_QUANTIZATIONS = (None, "fp8", "fp8_simulated")
# The `model_dtype` setting (before `precision`) names a pure precision.
MODEL_DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Precision -> (dtype of the weights and optimizer state, dtype of the forward/backward compute).
_PARAM_AND_COMPUTE = {
    "fp32": ("float32", "float32"),
    "bf16-mixed": ("float32", "bfloat16"),
    "bf16": ("bfloat16", "bfloat16"),
    "fp16": ("float16", "float16"),
}
# Largest finite float8_e4m3fn value.
FP8_E4M3_MAX = 448.0


def param_dtype(precision: str) -> str:
    """Dtype name of the learner's weights (and optimizer state) under ``precision``."""
    return _PARAM_AND_COMPUTE[precision][0]


def compute_dtype(precision: str) -> str:
    """Dtype name of the learner's forward/backward compute under ``precision``."""
    return _PARAM_AND_COMPUTE[precision][1]


def autocast_dtype(precision: str) -> Optional[torch.dtype]:
    """The autocast dtype of a mixed precision (None: the compute runs in the weights' own dtype)."""
    param, compute = _PARAM_AND_COMPUTE[precision]
    return DTYPES[compute] if param != compute else None


def fp8_round_per_channel(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` rounded through ``float8_e4m3fn`` with one scale per output channel, dequantized.

    ``s_c = max_j |w_cj| / 448``, ``ŵ_cj = s_c · fp8(w_cj / s_c)``: each row's largest magnitude maps to e4m3's
    largest finite value, and every entry keeps 3 mantissa bits (round to nearest even). Rows of zeros stay zero.
    Computed in float32; returned in ``weight``'s dtype.
    """
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    rounded = (w / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale
    return rounded.to(weight.dtype)


def is_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    """Whether a state entry is the weight of a linear layer that an FP8 engine quantizes: a 2-D ``*.weight`` other
    than the token embedding and the LM head (vLLM's FP8 keeps both in the model dtype)."""
    return name.endswith(".weight") and tensor.dim() == 2 and "embed" not in name and "lm_head" not in name


@dataclasses.dataclass(frozen=True)
class RolloutWeights:
    """How the rollout engines hold the policy's weights: their dtype, and whether linear weights are FP8-rounded
    (simulated FP8; a GPU engine's own FP8 quantizes on load instead, ``fp8_in_engine``)."""

    dtype: str = "float32"
    fp8_simulated: bool = False
    fp8_in_engine: bool = False

    def changes(self, param_dtype_name: str) -> bool:
        """Whether the engine's weights differ from learner weights of ``param_dtype_name``."""
        return self.fp8_simulated or self.dtype != param_dtype_name

    def apply(self, state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``state`` as the engines will hold it: FP8-rounded linear weights if simulated, every floating tensor
        cast to ``dtype``. Other entries (integer buffers) are passed through."""
        dtype = DTYPES[self.dtype]
        out = {}
        for name, tensor in state.items():
            if self.fp8_simulated and is_linear_weight(name, tensor):
                tensor = fp8_round_per_channel(tensor)
            out[name] = tensor.detach().to(dtype) if tensor.is_floating_point() else tensor
        return out

    @property
    def label(self) -> str:
        """``float32``, ``bfloat16``, ``bfloat16+fp8_simulated``, ``bfloat16+fp8`` ..."""
        return self.dtype + ("+fp8_simulated" if self.fp8_simulated else "+fp8" if self.fp8_in_engine else "")
