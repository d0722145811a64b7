"""The weight-sync payload: what the driver sends and a runner loads (shared by both sides).

The payload, a dict:
    rl_module       the learner's module state, ``{"default_policy": {"lm.<HF name>": tensor}}`` or its inner dict
                    (or a `PackedTensors` of it), or an ObjectRef to any of these
    weights_seq_no  the weights version being loaded
    probe           optional: ``{"token_ids": [int, ...], "logprobs": [float, ...]}``, the probe and the learner's
                    log-prob of each token after the first: the runner checks at load; or ``{"token_ids": [...]}``
                    alone: the runner scores the probe with its next generate call and returns it (`ProbeResult`)
    tolerance       largest allowed mean |learner - engine| log-prob on the probe (checks at load), and per token ...
    rtol            ... plus this times |learner log-prob| (low-precision engines)

The driver builds and sends it (`rllib_p3o.driver.weight_sync`); a runner loads it (`VLLMEnvRunner.load_policy_weights`).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Tuple, Union

import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rllib_p3o.core.precision import RolloutWeights
from rllib_p3o.sync.probe import WeightSyncError

# Payload keys (see the module docstring); the first two are RLlib's own names for a runner's state.
RL_MODULE = COMPONENT_RL_MODULE
VERSION = WEIGHTS_SEQ_NO
PROBE = "probe"
PROBE_TOKEN_IDS = "token_ids"
PROBE_LOGPROBS = "logprobs"
TOLERANCE = "tolerance"
RTOL = "rtol"
# The probe check's tolerance ``(atol, rtol)``, by the engines' precision (`default_tolerance`): each token's
# |learner - engine| log-prob may be at most ``atol + rtol * |learner log-prob|``, and their mean at most ``atol``
# (`rllib_p3o.sync.probe.check_probe`). The learner scores the probe with the weights exactly as sent, in the
# engine's dtype, so this bounds kernel numerics only. float32: vLLM and transformers agree to ~1e-5. bfloat16,
# measured on the demo model over 3 x 30 iterations (`benchmarks/precision.py`): mean differences 0.003-0.02,
# single tokens up to 0.26 (at log-prob -4.5). A corrupted, missed or mis-mapped tensor moves every token.
DEFAULT_TOLERANCE = 1e-3
DEFAULT_TOLERANCES = {"float32": (DEFAULT_TOLERANCE, 0.0), "bfloat16": (0.08, 0.1), "float16": (0.02, 0.03)}
# vLLM's FP8 (GPU) also quantizes activations, which the learner's probe does not imitate (not measured: no GPU).
FP8_ENGINE_TOLERANCE = (0.3, 0.2)

# `HFCausalLMRLModule` holds the Hugging Face model as ``self.lm``: its state names are "lm." + the HF names.
LM_PREFIX = "lm."


class PackedTensors:
    """A module state's tensors as flat byte arrays, for the object store.

    Ray pickles torch tensors through ``torch.save`` (a serialization pass over every byte), but ships numpy arrays
    out of band: one copy into the object store, zero-copy reads in every runner. Any dtype (bfloat16 included, which
    numpy lacks) travels as its raw bytes and is viewed back as the same dtype and shape; the receiving engine copies
    the values into its own parameters, so the read-only views are never written.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self.specs = {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()}
        self.arrays = {
            k: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy() for k, t in tensors.items()
        }

    def unpack(self) -> Dict[str, torch.Tensor]:
        with warnings.catch_warnings():  # torch warns that the object store's buffers are read-only
            warnings.simplefilter("ignore", UserWarning)
            return {
                k: torch.from_numpy(a).view(self.specs[k][0]).reshape(self.specs[k][1]) for k, a in self.arrays.items()
            }


def module_tensors(module_state: Union[Mapping[str, Any], PackedTensors]) -> Mapping[str, Any]:
    """``{module state name: tensor}`` of a payload's module state (packed or not, nested under the module id or
    not)."""
    state = module_state.unpack() if isinstance(module_state, PackedTensors) else module_state
    return state.get(DEFAULT_MODULE_ID, state)


def hf_weights(module_state: Union[Mapping[str, Any], PackedTensors], tied_embeddings: bool) -> Dict[str, Any]:
    """The learner module's weights under Hugging Face checkpoint names (what vLLM's reload expects)."""
    state = module_tensors(module_state)
    hf = {k[len(LM_PREFIX) :]: v.contiguous() for k, v in state.items() if k.startswith(LM_PREFIX)}
    if not hf:
        raise WeightSyncError(f"weight payload has no '{LM_PREFIX}*' tensors (keys: {list(state)[:5]})")
    if tied_embeddings:
        hf.pop("lm_head.weight", None)  # shares storage with the embedding; vLLM re-ties it
    return hf


def default_tolerance(rollout: RolloutWeights) -> Tuple[float, float]:
    """The probe tolerance ``(atol, rtol)`` for engines that hold the weights as ``rollout`` says."""
    return FP8_ENGINE_TOLERANCE if rollout.fp8_in_engine else DEFAULT_TOLERANCES[rollout.dtype]
