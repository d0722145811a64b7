"""``rllib-p3o export CHECKPOINT OUT [--merged] [--tokenizer DIR]``: a checkpoint's policy as a Hugging Face model
directory, without Ray or vLLM (`rllib_p3o.driver.export.export` does the work; its docstring says how)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rllib_p3o.core import storage
from rllib_p3o.driver.export import CheckpointNotFound, OutputNotEmpty, export

NAME = "export"
USAGE_ERROR = 2  # rllib_p3o.cli's exit status for a command that names the wrong thing


def add_parser(sub: Any) -> None:
    e = sub.add_parser(NAME, help="write a checkpoint's policy as a Hugging Face directory (no Ray, no vLLM)")
    e.add_argument("checkpoint", help="algorithm checkpoint, its rl_module directory, or a Tune trial/experiment dir")
    e.add_argument("out", help="output directory (created; must not exist or be empty)")
    e.add_argument("--merged", action="store_true", help="LoRA: write the base model with the adapter merged in")
    e.add_argument("--tokenizer", help="save this directory's tokenizer (default: the base model's)")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        out = export(args.checkpoint, args.out, merged=args.merged, tokenizer=args.tokenizer)
    except (CheckpointNotFound, OutputNotEmpty) as e:  # the command names the wrong place: a usage error
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except storage.StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the base model directory the module is rebuilt from is gone
        print(f"error: cannot rebuild the policy from {args.checkpoint}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return 0
