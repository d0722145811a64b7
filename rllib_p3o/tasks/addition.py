"""The claims bench's second task: add two 3-digit numbers column by column, carries written out, and give the sum.

    add:347+586=  →  7+6=13,4+8+1=13,3+5+1=9:933

How it differs from the sorting task (`rllib_p3o.tasks.sorting`), and why both are on the bench:

- **The answer is computed, not rearranged.** Sorting writes a permutation of the prompt's digits; here the model
  writes intermediate tokens (each column's digits, the carry coming in, the column's sum) and the answer follows
  from them: a slip in one column's carry changes every digit after it.
- **A sparse reward on the last few tokens.** Only the sum after ``:`` is checked, exactly: a completion of ~27
  tokens earns 1 or 0 for its last 3-4, whatever its intermediate tokens say (a right sum from a wrong trace counts;
  a right trace with a miscopied sum does not).
- **Longer completions.** ~27 tokens plus EOS against sorting's ~10: ratios and their mismatch accumulate over
  nearly three times as many tokens per completion.

The base model (`build_addition_model`) is pretrained like the sorting task's: it has seen the format with the right
computation only for ``correct_fraction`` of the lines; the others carry one slip (a carry dropped, or a column's
sum off by one), and their sum follows from the slip, so it adds sloppily and RL has to make the carries right.
Held-out pairs never appear in pretraining or RL prompts. With 2,500 steps and ``correct_fraction`` 0.2 it answers
0.32 of the held-out sums right when it samples at T = 1 (avg@4); on-policy P3O at a peak lr of 5e-4 took it to 0.89
in 30 iterations (one seed, before the bench: with 1,500 steps it started at 0.36 and reached only 0.77; at 1e-3 it
fell back to 0.41). The bench's pages give the measured spread.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rllib_p3o.tasks.splits import HeldOutSplit

_SUM = re.compile(r":\s*(\d+)")


def addition_reward(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_) -> List[float]:
    """Verifier reward (TRL's batched signature): 1.0 if the number after the completion's first ``:`` is exactly the
    sum, else 0.0 (the trace before it is not checked)."""
    out = []
    for completion, expected in zip(completions, answer):
        m = _SUM.search(completion)
        out.append(1.0 if m is not None and m.group(1) == expected else 0.0)
    return out


def columns(a: int, b: int, digits: int, slip: Optional[Tuple[int, str]] = None) -> Tuple[List[str], int]:
    """The trace of ``a + b`` column by column from the units (``"7+6=13"``, ``"4+8+1=13"`` with a carry in) and the
    sum it leads to. ``slip``: ``(column, "drop")`` forgets that column's carry in, ``(column, "off")`` writes its sum
    one too high (mod 10 in its units digit); the columns after it follow from the slip, as a sloppy adder's would."""
    a_digits, b_digits = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    carry, parts, out_digits = 0, [], []
    for i, (x, y) in enumerate(zip(a_digits, b_digits)):
        carry_in = 0 if slip == (i, "drop") else carry
        s = int(x) + int(y) + carry_in
        if slip == (i, "off"):
            s = s - s % 10 + (s % 10 + 1) % 10
        parts.append(f"{x}+{y}" + ("+1" if carry_in else "") + f"={s}")
        out_digits.append(s % 10)
        carry = s // 10
    total = int("".join(map(str, reversed(out_digits)))) + carry * 10**digits
    return parts, total


@dataclass(frozen=True)
class AdditionTask(HeldOutSplit):
    """Sums of two ``digits``-digit numbers (no leading zeros); ``num_rows`` distinct pairs, drawn by ``seed``, of
    which ``num_heldout`` are held out."""

    digits: int = 3
    num_rows: int = 20000
    num_heldout: int = 300
    seed: int = 0

    @staticmethod
    def prompt(a: int, b: int) -> str:
        return f"add:{a}+{b}="

    @staticmethod
    def answer(a: int, b: int) -> str:
        return str(a + b)

    def completion(self, a: int, b: int, slip: Optional[Tuple[int, str]] = None) -> str:
        """The trace and the sum it leads to: ``"7+6=13,4+8+1=13,3+5+1=9:933"`` (with ``slip``, a wrong one)."""
        parts, total = columns(a, b, self.digits, slip)
        return ",".join(parts) + f":{total}"

    def _pairs(self) -> List[Tuple[int, int]]:
        rng = random.Random(self.seed)
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        seen: Dict[Tuple[int, int], None] = {}
        while len(seen) < self.num_rows:
            seen.setdefault((rng.randint(low, high), rng.randint(low, high)))
        return list(seen)

    def _rows(self) -> List[Dict[str, str]]:
        return [{"prompt": self.prompt(a, b), "answer": self.answer(a, b)} for a, b in self._pairs()]

    @staticmethod
    def operands(prompt: str) -> Tuple[int, int]:
        a, b = prompt[len("add:") : -1].split("+")
        return int(a), int(b)

    def slip(self, a: int, b: int, rng: random.Random) -> str:
        """A trace with one slip that changes the sum (`columns`): a dropped carry where one comes in, else a column
        one off."""
        _, carries = self._carry_columns(a, b)
        choices = [(i, "drop") for i in carries] + [(i, "off") for i in range(self.digits)]
        while True:
            slip = rng.choice(choices)
            text = self.completion(a, b, slip)
            if not text.endswith(f":{a + b}"):
                return text

    def _carry_columns(self, a: int, b: int) -> Tuple[List[str], List[int]]:
        parts, _ = columns(a, b, self.digits)
        return parts, [i for i, p in enumerate(parts) if p.count("+") == 2]

    def pretraining_corpus(
        self, format_fraction: float = 0.5, correct_fraction: float = 0.2, seed: int = 0
    ) -> List[str]:
        """Every training pair's column sums as plain lines (``"7+6=13"``), plus the task's format for
        ``format_fraction`` of the pairs, right in ``correct_fraction`` of those lines and with one `slip` in the
        others. No held-out pair."""
        rows = self.train_rows()
        pairs = [self.operands(r["prompt"]) for r in rows]
        rng = random.Random(seed)
        order = list(range(len(rows)))
        rng.shuffle(order)
        formatted = order[: round(format_fraction * len(rows))]
        num_correct = round(correct_fraction * len(formatted))
        lines = [",".join(columns(a, b, self.digits)[0]) for a, b in pairs]
        lines += [rows[i]["prompt"] + self.completion(*pairs[i]) for i in formatted[:num_correct]]
        lines += [rows[i]["prompt"] + self.slip(*pairs[i], rng) for i in formatted[num_correct:]]
        return lines

    def corpus(self) -> List[str]:
        """Text the tokenizer is trained on."""
        return ["add:0123456789+=,:"]


def build_addition_model(
    path: str,
    *,
    task: Optional[AdditionTask] = None,
    pretrain_steps: int = 2500,
    seed: int = 0,
    format_fraction: float = 0.5,
    correct_fraction: float = 0.2,
    overwrite: bool = False,
    progress: Optional[Callable[[int, float], None]] = None,
) -> str:
    """The second bench task's base model: a tiny Qwen2 (`build_tiny_model`) pretrained on
    `AdditionTask.pretraining_corpus`. Cached like the sorting model: a directory built with the same settings (and
    torch thread count) is reused."""
    from rllib_p3o.tasks.tiny_model import build_bench_model

    return build_bench_model(
        path,
        task or AdditionTask(),
        pretrain_steps=pretrain_steps,
        seed=seed,
        format_fraction=format_fraction,
        correct_fraction=correct_fraction,
        overwrite=overwrite,
        progress=progress,
    )
