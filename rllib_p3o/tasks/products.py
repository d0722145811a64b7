"""Tool-use task: two-digit products, ``"47*86="`` → ``"4042"``, with a calculator tool the model may call.

A tiny model cannot multiply two-digit numbers; with the tool it only has to call it and copy the result. One
episode, in the text format (no chat template; `rllib_p3o.runner.multiturn.ToolEnv`):

    47*86=<tool_call>calc(47*86)</tool_call>      model turn 1 (stops at the </tool_call> token)
    <tool_response>4042</tool_response>           environment turn (the tool's result)
    4042<eos>                                     model turn 2: the answer, scored by `product_reward`

`product_reward` is the demo's verifier (`arithmetic_reward`: the answer's leading integer must be the product).

The base model (`build_tool_model`) sees the tool format only in its pretraining text (`pretraining_corpus`):
additions written as tool calls, and products answered *directly* (most lines) or with the tool (a few). So it
knows how to call the tool and copy its result, but by habit answers products itself, mostly wrongly; RL has to
make the tool call its habit. The held-out split is a fixed random subset of operand pairs never seen in training.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from rllib_p3o.tasks.arithmetic import arithmetic_reward
from rllib_p3o.tasks.splits import HeldOutSplit

# The final answer's verifier: the demo's (the answer's leading integer must be the product).
product_reward = arithmetic_reward

TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
STOP_TOKENS = ("</tool_call>",)
_EXPRESSION = re.compile(r"^\s*(\d+)\s*([+*-])\s*(\d+)\s*$")


def calc(expression: str) -> str:
    """The calculator tool: ``"47*86"`` → ``"4042"`` (one +, - or * of two integers; anything else raises)."""
    m = _EXPRESSION.match(expression)
    if m is None:
        raise ValueError(f"cannot evaluate {expression!r}: expected <int><+|-|*><int>")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def tool_line(a: int, op: str, b: int) -> str:
    """A whole episode's text with a tool call (see the module docstring)."""
    result = calc(f"{a}{op}{b}")
    return f"{a}{op}{b}=<tool_call>calc({a}{op}{b})</tool_call><tool_response>{result}</tool_response>{result}"


@dataclass(frozen=True)
class ProductTask(HeldOutSplit):
    """``a * b`` for two-digit ``a, b``."""

    num_heldout: int = 200
    seed: int = 0

    def _rows(self) -> List[Dict[str, str]]:
        return [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a in range(10, 100) for b in range(10, 100)]

    @staticmethod
    def operands(row: Dict[str, str]) -> tuple:
        a, b = row["prompt"][:-1].split("*")
        return int(a), int(b)

    def pretraining_corpus(self, tool_fraction: float = 0.05, seed: int = 0) -> List[str]:
        """Additions as tool calls, products of the training pairs answered directly, and ``tool_fraction`` of
        those products with the tool instead (no held-out pair appears)."""
        rng = random.Random(seed)
        sums = [tool_line(a, "+", b) for a in range(10, 100) for b in range(10, 100) if rng.random() < 0.5]
        products = []
        for row in self.train_rows():
            a, b = self.operands(row)
            products.append(tool_line(a, "*", b) if rng.random() < tool_fraction else f"{a}*{b}={a * b}")
        return sums + products

    def tokenizer_corpus(self) -> List[str]:
        return [tool_line(a, op, b) for a in (10, 47, 99) for b in (10, 86, 99) for op in "+*"] + ["calc"] * 10


def build_tool_model(
    path: str,
    *,
    pretrain_steps: int = 2000,
    seed: int = 0,
    tool_fraction: float = 0.05,
    overwrite: bool = False,
    progress: Optional[Callable[[int, float], None]] = None,
) -> str:
    """The tool-use example's base model: a tiny model whose tokenizer has the tool tags as single tokens, pretrained
    on `ProductTask.pretraining_corpus`. Cached like `rllib_p3o.tasks.build_demo_model`."""
    import torch

    from rllib_p3o.tasks.model_cache import built_with, mark_built
    from rllib_p3o.tasks.pretrain import pretrain_causal_lm
    from rllib_p3o.tasks.tiny_model import build_tiny_model

    task = ProductTask()
    args = {
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "tool_fraction": tool_fraction,
        "threads": torch.get_num_threads(),
        "version": 1,
    }
    if not overwrite and built_with(path, args):
        return path
    build_tiny_model(path, task.tokenizer_corpus(), vocab_size=48, added_tokens=TOOL_TAGS, seed=seed, overwrite=True)
    pretrain_causal_lm(
        path, task.pretraining_corpus(tool_fraction, seed=seed), steps=pretrain_steps, seed=seed, progress=progress
    )
    mark_built(path, args)
    return path
