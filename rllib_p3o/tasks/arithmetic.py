"""Demo task: modular addition of two-digit numbers, ``"(37+45)%10="`` → ``"2"``, checked by a verifier.

10 000 distinct prompts whose answers depend on both operands. The held-out split is a fixed random subset of
operand *pairs* that never appears in training, so held-out accuracy measures whether the policy learned the
operation rather than memorized prompts. A random policy scores about 1/V (V = vocabulary size).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Dict, List, Sequence

_LEADING_INT = re.compile(r"^\s*(-?\d+)")


def arithmetic_reward(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_) -> List[float]:
    """Verifier reward (TRL's batched signature): 1.0 if the completion starts with the right number, else 0.0."""
    out = []
    for completion, expected in zip(completions, answer):
        m = _LEADING_INT.match(completion)
        out.append(1.0 if m is not None and m.group(1) == str(expected) else 0.0)
    return out


@dataclass(frozen=True)
class ArithmeticTask:
    """``(a+b) % modulus`` for ``a, b`` in ``[0, max_operand]``, zero-padded to two digits."""

    max_operand: int = 99
    modulus: int = 10
    num_heldout: int = 200
    seed: int = 0

    def prompt(self, a: int, b: int) -> str:
        return f"({a:02d}+{b:02d})%{self.modulus}="

    def _rows(self) -> List[Dict[str, str]]:
        return [
            {"prompt": self.prompt(a, b), "answer": str((a + b) % self.modulus)}
            for a in range(self.max_operand + 1)
            for b in range(self.max_operand + 1)
        ]

    def splits(self) -> Dict[str, List[Dict[str, str]]]:
        """``{"train": rows, "heldout": rows}``: disjoint by prompt; each row has ``prompt`` and ``answer``."""
        rows = self._rows()
        random.Random(self.seed).shuffle(rows)
        return {"heldout": rows[: self.num_heldout], "train": rows[self.num_heldout:]}

    def train_rows(self) -> List[Dict[str, str]]:
        return self.splits()["train"]

    def heldout_rows(self) -> List[Dict[str, str]]:
        return self.splits()["heldout"]

    def pretraining_corpus(self) -> List[str]:
        """Plain sums ``"37+45=82"`` of the *training* pairs only: knowledge for a base model, not the task.

        The demo's base model is pretrained on this (next-token prediction) before RL. It never sees the task's
        format ``(a+b)%10=`` nor any held-out operand pair, so its held-out task accuracy starts near chance.
        """
        pairs = {tuple(int(x) for x in r["prompt"][1:6].split("+")) for r in self.train_rows()}
        return [f"{a:02d}+{b:02d}={a + b}" for a, b in sorted(pairs)]

    def corpus(self) -> List[str]:
        """Text the demo tokenizer is trained on: the prompts and answers (no pairing of the two)."""
        rows = self._rows()
        return [r["prompt"] for r in rows] + [str(i) for i in range(2 * self.max_operand + 1)]
