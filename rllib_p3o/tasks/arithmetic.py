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

    def pretraining_corpus(self, format_fraction: float = 0.02, seed: int = 0) -> List[str]:
        """Plain sums ``"37+45=82"`` of the *training* pairs, plus the task's format for a few of them.

        The demo's base model is pretrained on this (next-token prediction) before RL; no held-out pair appears.
        ``format_fraction`` of the training pairs (2%, ~200 lines, chosen by ``seed``) also appear in the task's own
        format, ``"(37+45)%10=2"``, the way a real base model has seen a task's format a few times in its corpus.

        Why the format lines: without them the base model has never seen ``(..)%10=`` nor when to stop, samples a
        right answer ~1% of the time, and only 2-4% of 8-completion prompt groups hold any reward variance. RL then
        lives on one or two groups per iteration, and whichever digit gets reinforced first wins for every prompt
        (a near-deterministic wrong policy with no learning signal left); whether that happens depended on the
        floats of the pretraining. With 2% format lines the base answers with one digit, at chance (held-out
        ~0.1), and about half of all groups carry signal, over every seed measured. Much more (4%) and the base
        model starts to generalize the operation itself, on some seeds and not others (held-out 0.1-0.98).
        """
        pairs = {tuple(int(x) for x in r["prompt"][1:6].split("+")) for r in self.train_rows()}
        sums = [f"{a:02d}+{b:02d}={a + b}" for a, b in sorted(pairs)]
        rows = sorted(self.train_rows(), key=lambda r: r["prompt"])
        random.Random(seed).shuffle(rows)
        formatted = [r["prompt"] + r["answer"] for r in rows[: round(format_fraction * len(rows))]]
        return sums + formatted

    def corpus(self) -> List[str]:
        """Text the demo tokenizer is trained on: the prompts and answers (no pairing of the two)."""
        rows = self._rows()
        return [r["prompt"] for r in rows] + [str(i) for i in range(2 * self.max_operand + 1)]
