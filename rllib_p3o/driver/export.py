"""A policy as a Hugging Face model directory: from a checkpoint (`export`, what ``rllib-p3o export CHECKPOINT OUT``
runs) or from a running algorithm's first learner (`export_from_learners`, what ``P3O.export_hf`` runs). One
implementation: both write the module with `HFCausalLMRLModule.save_pretrained` (or, from a checkpoint, the
trained weights over the base directory's) and copy a local result to a URI with `rllib_p3o.core.storage`.

Reads the policy module straight from the checkpoint's ``learner_group/learner/rl_module/default_policy`` directory
(RLlib's Checkpointable files): no Ray cluster, no vLLM engine, no learner. ``CHECKPOINT`` may be an algorithm
checkpoint (``algo.save_to_path(...)``, Tune's ``checkpoint_00000N``), the module directory itself, or a Tune trial
or experiment directory, whose latest checkpoint is used. ``CHECKPOINT`` and ``OUT`` may be URIs
(`rllib_p3o.core.storage`: ``s3://...`` where Tune's ``storage_path`` put the checkpoints; a trial's newest
``checkpoint_*`` there is the highest-numbered one). The base model directory the run trained (its ``model``) must
still exist.

Full fine-tuning, base model a local directory with safetensors weights: ``OUT`` is that directory with the trained
weights in place of its own, under the same tensor names and shapes (tied copies left out, as the base has them),
``config.json``'s dtype set to the one the run trained in, and its other files (tokenizer, generation config, custom
code) copied. This needs neither the model's code nor transformers' start-up, which is most of an export's time
otherwise (`benchmarks/export.py`). Where the names do not match, and under LoRA or with ``--tokenizer``, the
module is rebuilt from the base model (`HFCausalLMRLModule`), the checkpoint's weights are loaded into it and
transformers saves it: under LoRA ``OUT`` gets the adapter in peft format (load it with
``peft.PeftModel.from_pretrained(base, OUT)``), with ``--merged`` the base model with the adapter merged in;
``--tokenizer DIR`` saves that directory's tokenizer instead of the base model's.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import tempfile
from typing import Any, Dict, Optional, Tuple

from rllib_p3o.core import storage
from rllib_p3o.data.provenance import write_lineage

MODULE_DIR = os.path.join("learner_group", "learner", "rl_module", "default_policy")
# Files RLlib's Checkpointable writes into every component's directory.
CTOR_FILE = "class_and_ctor_args.pkl"
STATE_FILE = "module_state.pkl"
# The RLModule holds the Hugging Face model as ``self.lm``: its state keys are the model's, under this prefix.
LM_PREFIX = "lm."
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
# A base directory's files that are weights in some format (replaced by the trained ones, never copied: other tools
# would read the base's untrained weights beside them).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".h5",
    ".msgpack",
    ".onnx",
    ".onnx_data",
    ".npz",
)


class CheckpointNotFound(ValueError):
    """The path holds no policy module checkpoint; the message says what was looked for."""


class OutputNotEmpty(ValueError):
    """``OUT`` already holds files: an export there would mix with them (a stale adapter or weight file is what
    transformers would load), or overwrite the base model itself."""


def module_dir(path: str) -> str:
    """The policy module's checkpoint directory under ``path`` (module docstring); `CheckpointNotFound` if none."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, CTOR_FILE)) and os.path.basename(path) == "default_policy":
        return path
    if os.path.isdir(os.path.join(path, MODULE_DIR)):
        return os.path.join(path, MODULE_DIR)
    # A Tune trial directory (checkpoint_*/ inside): its highest-numbered checkpoint; an experiment directory
    # (trial directories inside): of those, the one written last.
    in_trial = _latest_in_trial(path)
    if in_trial:
        return in_trial
    latest = [m for m in map(_latest_in_trial, glob.glob(os.path.join(path, "*"))) if m]
    if latest:
        return max(latest, key=lambda m: os.path.getmtime(os.path.join(m, STATE_FILE)))
    if not os.path.exists(path):
        raise CheckpointNotFound(f"checkpoint not found: {path}")
    raise CheckpointNotFound(
        f"{path} holds no policy checkpoint: looked for {MODULE_DIR}/ in it, in its checkpoint_*/ directories and in "
        "its trials' checkpoint_*/ directories (write checkpoints with Tune's CheckpointConfig or algo.save_to_path)"
    )


def _checkpoint_number(name: str) -> int:
    """``checkpoint_000012`` -> 12; -1 for other names."""
    prefix, _, number = name.partition("_")
    return int(number) if prefix == "checkpoint" and number.isdigit() else -1


def _latest_in_trial(trial: str) -> Optional[str]:
    """The module directory of a trial directory's highest-numbered complete checkpoint (module state written), or
    None."""
    if not os.path.isdir(trial):
        return None
    numbered = sorted((_checkpoint_number(name), name) for name in os.listdir(trial) if _checkpoint_number(name) >= 0)
    for _, name in reversed(numbered):
        module = os.path.join(trial, name, MODULE_DIR)
        if os.path.isfile(os.path.join(module, STATE_FILE)):
            return module
    return None


def read_module(source: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The ``model_config`` and the state (name -> tensor) of the policy module checkpoint in ``source``, read from
    RLlib's files without building the module."""
    with open(os.path.join(source, CTOR_FILE), "rb") as f:
        _, kwargs = pickle.load(f)["ctor_args_and_kwargs"]
    with open(os.path.join(source, STATE_FILE), "rb") as f:
        state = pickle.load(f)
    return dict(kwargs.get("model_config") or {}), state


def base_weight_shapes(base_dir: str) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Name -> shape of the tensors in a model directory's safetensors files (headers only); None without them."""
    from safetensors import safe_open

    index = os.path.join(base_dir, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(base_dir, SAFETENSORS)):
        files = [SAFETENSORS]
    else:
        return None
    shapes = {}
    for name in files:
        with safe_open(os.path.join(base_dir, name), framework="pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def weights_under_base_names(
    state: Dict[str, Any], base_shapes: Dict[str, Tuple[int, ...]]
) -> Optional[Dict[str, Any]]:
    """The module's weights under the base directory's tensor names, or None where they do not correspond: every
    state key is the model's under ``LM_PREFIX``, the base's names are among them with the same shapes, and a name
    the base does not have holds a copy of one it has (a tied LM head: the base left it out when it was saved)."""
    weights = {k[len(LM_PREFIX) :]: v for k, v in state.items() if k.startswith(LM_PREFIX)}
    if len(weights) != len(state) or not set(base_shapes) <= set(weights):
        return None
    kept = {name: weights[name] for name in base_shapes}
    if any(tuple(t.shape) != base_shapes[name] for name, t in kept.items()):
        return None
    import torch

    for name in set(weights) - set(kept):
        extra = weights[name]
        if not any(t.shape == extra.shape and t.dtype == extra.dtype and torch.equal(t, extra) for t in kept.values()):
            return None
    return kept


def write_over_base(source: str, out: str) -> bool:
    """Write ``out`` as the base model directory with the trained weights of the module checkpoint ``source`` in
    place of its own (module docstring). Returns False, having written nothing, where that does not apply."""
    try:
        model_config, state = read_module(source)
    except (OSError, ImportError, AttributeError, KeyError, ValueError, pickle.UnpicklingError, EOFError):
        return False  # files this reading does not know: RLlib's own from_checkpoint (the other way) reads them
    base_dir = model_config.get("model")
    if model_config.get("lora") or not base_dir or not os.path.isdir(base_dir):
        return False
    base_shapes = base_weight_shapes(base_dir)
    weights = None if base_shapes is None else weights_under_base_names(state, base_shapes)
    if weights is None:
        return False
    from huggingface_hub import save_torch_state_dict

    os.makedirs(out, exist_ok=True)
    for entry in os.scandir(base_dir):
        if entry.is_file() and entry.name != CONFIG and not entry.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(entry.path, os.path.join(out, entry.name))
    with open(os.path.join(base_dir, CONFIG)) as f:
        config = json.load(f)
    # The dtype the module loaded the model in, as save_pretrained records it (older configs: torch_dtype).
    config["dtype"] = model_config.get("dtype", "float32")
    if "torch_dtype" in config:
        config["torch_dtype"] = config["dtype"]
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_torch_state_dict(weights, out, metadata={"format": "pt"})
    write_lineage(out, base_dir)  # (the base's own lineage file, copied above, is replaced by the longer one)
    return True


def fetch_module_dir(uri: str, local_dir: str) -> str:
    """`module_dir` for a checkpoint in an object store (``s3://...``: Tune's ``storage_path`` there): the module
    directory of an algorithm checkpoint, the module directory itself, or a trial directory's highest-numbered
    ``checkpoint_*``, copied into ``local_dir``; returns the local copy."""
    import pyarrow.fs

    root = storage.locate(uri)
    candidates = [root.child(*MODULE_DIR.split(os.sep))]
    if root.name == os.path.basename(MODULE_DIR):
        candidates.insert(0, root)
    if root.is_dir():
        selector = pyarrow.fs.FileSelector(root.path, allow_not_found=True)
        checkpoints = sorted(
            (_checkpoint_number(info.base_name), info.base_name)
            for info in root.filesystem.get_file_info(selector)
            if info.type == pyarrow.fs.FileType.Directory and _checkpoint_number(info.base_name) >= 0
        )
        candidates += [root.child(name, *MODULE_DIR.split(os.sep)) for _, name in reversed(checkpoints)]
    for candidate in candidates:
        if candidate.child(STATE_FILE).exists():  # written after the constructor file: a complete checkpoint
            storage.download_dir(candidate, local_dir)
            return local_dir
    raise CheckpointNotFound(
        f"{root} holds no policy checkpoint: looked for {MODULE_DIR}/ in it and in its checkpoint_*/ directories "
        "(give the trial's or the checkpoint's URI)"
    )


def export(checkpoint: str, out: str, merged: bool = False, tokenizer: str | None = None) -> str:
    """Write the policy of ``checkpoint`` to ``out`` as a Hugging Face directory (module docstring); returns
    ``out``. Either may be a URI (`rllib_p3o.core.storage`): the checkpoint's module is read through a local copy,
    and the directory is written locally, then copied to ``out``."""
    target = storage.locate(out)
    if target.exists() and (not target.is_dir() or target.has_entries()):
        raise OutputNotEmpty(f"{target} already exists and is not empty: export into a new or empty directory")
    with tempfile.TemporaryDirectory(prefix="p3o-export-") as tmp:
        local = not storage.is_uri(checkpoint)
        source = module_dir(checkpoint) if local else fetch_module_dir(checkpoint, os.path.join(tmp, "module"))
        if target.is_local:
            return _write(source, target.path, merged, tokenizer)
        target.makedirs()  # a bad bucket fails before anything is built
        storage.upload_dir(_write(source, os.path.join(tmp, "out"), merged, tokenizer), target)
    return out


def _write(source: str, out: str, merged: bool, tokenizer: Optional[str]) -> str:
    """The module checkpoint in the local directory ``source`` as a Hugging Face directory at the local ``out``."""
    if tokenizer is None and write_over_base(source, out):
        return out
    from rllib_p3o.learner.rl_module import HFCausalLMRLModule

    module = HFCausalLMRLModule.from_checkpoint(source)
    return module.save_pretrained(out, tokenizer_from=tokenizer, merged=merged)


def export_from_learners(learner_group: Any, path: str, merged: bool = False) -> str:
    """The current policy of a running algorithm's first learner written to ``path`` (a directory on the driver's node
    or a URI) as `export` writes a checkpoint's: under LoRA the adapter in peft format, or with ``merged`` a full
    model with the adapter merged in. As RLlib saves a checkpoint, the learner writes the model into a temporary
    directory on its own node, which is brought to the driver's node through Ray when that is another node, and
    copied to ``path`` from there. Returns ``path``."""
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.tune.utils.file_transfer import sync_dir_between_nodes

    target = storage.locate(path)
    target.makedirs()  # a bad bucket or a read-only directory fails before the model is written anywhere

    def save(learner: Any) -> Tuple[str, str]:
        tmp = tempfile.mkdtemp(prefix="p3o-export-")
        learner.module[DEFAULT_MODULE_ID].unwrapped().save_pretrained(tmp, merged=merged)
        return ray.util.get_node_ip_address(), tmp

    first = None if learner_group.is_local else learner_group._worker_manager.healthy_actor_ids()[:1]
    learner_ip, learner_tmp = next(iter(learner_group.foreach_learner(save, remote_actor_ids=first))).get()
    here = learner_tmp
    if learner_ip != ray.util.get_node_ip_address():
        here = tempfile.mkdtemp(prefix="p3o-export-")
        sync_dir_between_nodes(learner_ip, learner_tmp, ray.util.get_node_ip_address(), here, max_size_bytes=None)
        learner_group.foreach_learner(lambda _: shutil.rmtree(learner_tmp), remote_actor_ids=first)
    try:
        storage.upload_dir(here, target)
    finally:
        shutil.rmtree(here, ignore_errors=True)
    return os.fspath(path)
