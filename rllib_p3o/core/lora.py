"""LoRA: the adapter spec, its validation against the model, and the adapter's names on each side of a sync.

``config.training(lora={"r": 16, "alpha": 32, "target_modules": [...], "dropout": 0.0})`` makes the learner wrap
the policy with ``peft`` (only the adapter trains; the frozen base doubles as the reference model) and the runners
serve the same frozen base with vLLM's LoRA support, swapping in each synced adapter (`rllib_p3o.runner.vllm_ext`).

Names of one adapter tensor on the way:
    learner module state  ``lm.base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight``
    peft file / vLLM      ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

# vLLM serves adapters of rank up to its ``max_lora_rank``, one of these (`vllm.config.lora.MaxLoRARanks`).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULTS: Dict[str, Any] = {"r": 16, "alpha": 32, "target_modules": None, "dropout": 0.0}
# Linear layers vLLM cannot put an adapter on (they are not LoRA layers in its models).
_NOT_SERVABLE = ("lm_head",)
# The learner module holds the peft model as ``self.lm`` (`rllib_p3o.learner.rl_module`), under peft's default adapter name.
_MODULE_PREFIX = "lm."
_ADAPTER_NAME = "default"


def resolve(spec: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The spec with its defaults filled in (None: no LoRA). Unknown keys raise (a typo would silently train
    another adapter than asked)."""
    if spec is None:
        return None
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown LoRA setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **spec}
    if out["target_modules"] is not None:
        out["target_modules"] = sorted(set(out["target_modules"]))
    return out


def linear_layer_names(model_path: str, trust_remote_code: bool = False) -> List[str]:
    """The distinct short names of the model's linear layers (``q_proj``, ``down_proj``, ...), from its config alone
    (built on the meta device: no weights are read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def validate(spec: Dict[str, Any], model_path: str, trust_remote_code: bool = False) -> Dict[str, Any]:
    """Check a resolved spec against the model; returns it with ``target_modules`` filled in (default: every linear
    layer vLLM can serve an adapter on). Raises ValueError naming the model's layers."""
    r, alpha, dropout = spec["r"], spec["alpha"], spec["dropout"]
    if not (isinstance(r, int) and 1 <= r <= VLLM_MAX_LORA_RANKS[-1]):
        raise ValueError(f"LoRA r must be an int in [1, {VLLM_MAX_LORA_RANKS[-1]}], got {r!r}")
    if not alpha > 0 or not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA alpha must be > 0 and dropout in [0, 1), got alpha={alpha!r}, dropout={dropout!r}")
    layers = linear_layer_names(model_path, trust_remote_code)
    servable = [n for n in layers if n not in _NOT_SERVABLE]
    targets = spec["target_modules"] or servable
    unknown = [t for t in targets if t not in layers]
    if unknown:
        raise ValueError(
            f"LoRA target_modules {unknown} are not layers of {model_path}; its linear layers are: {', '.join(layers)}"
        )
    unservable = [t for t in targets if t not in servable]
    if unservable:
        raise ValueError(
            f"LoRA target_modules {unservable}: vLLM serves no adapter on these; choose among {', '.join(servable)}"
        )
    return {**spec, "target_modules": sorted(targets)}


def peft_config(spec: Mapping[str, Any]):
    """The ``peft.LoraConfig`` of a validated spec."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec["r"],
        lora_alpha=spec["alpha"],
        lora_dropout=spec["dropout"],
        target_modules=list(spec["target_modules"]),
        bias="none",
        task_type="CAUSAL_LM",
    )


def vllm_max_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds an adapter of rank ``r``."""
    return next(k for k in VLLM_MAX_LORA_RANKS if k >= r)


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_state(module_state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The adapter's tensors of a learner module state, under peft's file names (what vLLM loads)."""
    out = {}
    for name, tensor in module_state.items():
        if is_adapter_param(name):
            key = name[len(_MODULE_PREFIX) :] if name.startswith(_MODULE_PREFIX) else name
            out[key.replace(f".{_ADAPTER_NAME}.", ".")] = tensor
    if not out:
        raise ValueError(f"no LoRA adapter tensors in the module state (keys: {list(module_state)[:5]})")
    return out
