"""``rllib-p3o export CHECKPOINT OUT [--merged]``: a checkpoint's policy as a Hugging Face model directory.

Reads the policy module straight from the checkpoint's ``learner_group/learner/rl_module/default_policy`` directory
with RLlib's ``Checkpointable.from_checkpoint`` (`HFCausalLMRLModule`): no Ray cluster, no vLLM engine, no learner.
``CHECKPOINT`` may be an algorithm checkpoint (``algo.save_to_path(...)``, Tune's ``checkpoint_00000N``), the module
directory itself, or a Tune trial or experiment directory, whose latest checkpoint is used.

The module is rebuilt from its base model directory (the ``model`` the run trained, which must still exist) and the
checkpoint's weights are loaded into it. Under LoRA ``OUT`` gets the adapter in peft format (load it with
``peft.PeftModel.from_pretrained(base, OUT)``); with ``--merged``, the base model with the adapter merged in. The
tokenizer is the base model's (``--tokenizer DIR`` for another).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from typing import Any

NAME = "export"
MODULE_DIR = os.path.join("learner_group", "learner", "rl_module", "default_policy")
# Files RLlib's Checkpointable writes into every component's directory.
CTOR_FILE = "class_and_ctor_args.pkl"


class CheckpointNotFound(ValueError):
    """The path holds no policy module checkpoint; the message says what was looked for."""


def add_parser(sub: Any) -> None:
    e = sub.add_parser(NAME, help="write a checkpoint's policy as a Hugging Face directory (no Ray, no vLLM)")
    e.add_argument("checkpoint", help="algorithm checkpoint, its rl_module directory, or a Tune trial/experiment dir")
    e.add_argument("out", help="output directory (created)")
    e.add_argument("--merged", action="store_true", help="LoRA: write the base model with the adapter merged in")
    e.add_argument("--tokenizer", help="save this directory's tokenizer (default: the base model's)")


def module_dir(path: str) -> str:
    """The policy module's checkpoint directory under ``path`` (module docstring); `CheckpointNotFound` if none."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, CTOR_FILE)) and os.path.basename(path) == "default_policy":
        return path
    if os.path.isdir(os.path.join(path, MODULE_DIR)):
        return os.path.join(path, MODULE_DIR)
    # A Tune trial directory (checkpoint_*/ inside) or experiment directory (trial dirs inside): the newest.
    candidates = glob.glob(os.path.join(path, "checkpoint_*", MODULE_DIR)) or glob.glob(
        os.path.join(path, "*", "checkpoint_*", MODULE_DIR)
    )
    if candidates:
        return max(candidates, key=lambda p: os.path.getmtime(os.path.dirname(p)))
    if not os.path.exists(path):
        raise CheckpointNotFound(f"checkpoint not found: {path}")
    raise CheckpointNotFound(
        f"{path} holds no policy checkpoint: looked for {MODULE_DIR}/ in it, in its checkpoint_*/ directories and in "
        "its trials' checkpoint_*/ directories (write checkpoints with Tune's CheckpointConfig or algo.save_to_path)"
    )


def export(checkpoint: str, out: str, merged: bool = False, tokenizer: str | None = None) -> str:
    """Write the policy of ``checkpoint`` to ``out`` as a Hugging Face directory; returns ``out``."""
    from rllib_p3o.learner.rl_module import HFCausalLMRLModule

    source = module_dir(checkpoint)
    module = HFCausalLMRLModule.from_checkpoint(source)
    return module.save_pretrained(out, tokenizer_from=tokenizer, merged=merged)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        out = export(args.checkpoint, args.out, merged=args.merged, tokenizer=args.tokenizer)
    except CheckpointNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the base model directory the module is rebuilt from is gone
        print(f"error: cannot rebuild the policy from {args.checkpoint}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return 0
