"""Demo task: modular addition of two-digit numbers, ``"(37+45)%10="`` → ``"2"``, checked by a verifier.

10 000 distinct prompts whose answers depend on both operands. The held-out split is a fixed random subset of
operand *pairs* that never appears in training, so held-out accuracy measures whether the policy learned the
operation rather than memorized prompts. A random policy scores about 1/V (V = vocabulary size).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from rllib_p3o.tasks.splits import HeldOutSplit

_LEADING_INT = re.compile(r"^\s*(-?\d+)")


def arithmetic_reward(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_) -> List[float]:
    """Verifier reward (TRL's batched signature): 1.0 if the completion starts with the right number, else 0.0."""
    out = []
    for completion, expected in zip(completions, answer):
        m = _LEADING_INT.match(completion)
        out.append(1.0 if m is not None and m.group(1) == str(expected) else 0.0)
    return out


@dataclass(frozen=True)
class ArithmeticTask(HeldOutSplit):
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

    def carry_slip(self, a: int, b: int) -> str:
        """The classic slip of carrying a spurious 1: ``(a + b + 1) % modulus``, never the right answer."""
        return str((a + b + 1) % self.modulus)

    def pretraining_corpus(
        self, format_fraction: float = 0.3, correct_fraction: float = 0.4, seed: int = 0
    ) -> List[str]:
        """Plain sums ``"37+45=82"`` of the *training* pairs, plus the task's format for some of them.

        The demo's base model is pretrained on this (next-token prediction) before RL; no held-out pair appears.
        ``format_fraction`` of the training pairs (chosen by ``seed``) also appear in the task's own format; in
        ``correct_fraction`` of those lines the answer is right, ``"(37+45)%10=2"``, and in the others it carries a
        spurious 1, ``"(37+45)%10=3"``. So the base model knows the operation but answers it sloppily, as a
        pretrained model often does before RL: it samples the right digit 31-43% of the time and its greedy answer
        is right on 19-41% of held-out prompts (5 seeds measured); RL has to make the right answer its habit.

        Why this design: with plain sums only, the base model almost never samples a right answer, so almost no
        group carries reward variance and whether RL learns at all depends on the floats of the pretraining. With
        a few format lines it answers at chance and RL has to discover the operation itself, which some seeds do
        not in a demo's time; a few hundred correct lines more and some seeds generalize the operation before RL
        while others do not. With 30% of the pairs in the format, every seed learns the operation in the format,
        and the spurious carries keep it sloppy: 79-86% of groups carry signal from the first iteration. (The
        alternatives' measurements: CHANGELOG, 0.1.0, "Demo base model".)
        """
        rows = sorted(self.train_rows(), key=lambda r: r["prompt"])
        sums = [f"{a:02d}+{b:02d}={a + b}" for a, b in map(self._operands, rows)]
        random.Random(seed).shuffle(rows)
        formatted = rows[: round(format_fraction * len(rows))]
        num_correct = round(correct_fraction * len(formatted))
        return (
            sums
            + [r["prompt"] + r["answer"] for r in formatted[:num_correct]]
            + [r["prompt"] + self.carry_slip(*self._operands(r)) for r in formatted[num_correct:]]
        )

    @staticmethod
    def _operands(row: Dict[str, str]) -> Tuple[int, int]:
        a, b = row["prompt"][1:6].split("+")
        return int(a), int(b)

    def corpus(self) -> List[str]:
        """Text the demo tokenizer is trained on: the prompts and answers (no pairing of the two)."""
        rows = self._rows()
        return [r["prompt"] for r in rows] + [str(i) for i in range(2 * self.max_operand + 1)]


def train_rows() -> List[Dict[str, str]]:
    """The demo's training rows (`ArithmeticTask` with its defaults), by name for configs:
    ``dataset: rllib_p3o.tasks.arithmetic:train_rows``."""
    return ArithmeticTask().train_rows()


def heldout_rows() -> List[Dict[str, str]]:
    """The demo's held-out rows, by name for configs: ``eval_dataset: rllib_p3o.tasks.arithmetic:heldout_rows``."""
    return ArithmeticTask().heldout_rows()
