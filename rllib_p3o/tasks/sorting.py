"""The claims bench's task: sort a list of digits, ``"sort:7,3,9,1,4="`` → ``"1,3,4,7,9"``, checked by a verifier.

Why this task (the demo's answer is one token and saturates in a few iterations, so no method can separate there):
- **Long, variable answers.** Lists of ``min_len``-``max_len`` digits give answers of 7-13 tokens plus EOS (mean
  ~10): a sampler/trainer gap accumulates over every token of an answer, as it does in the paper's long responses.
- **A verifier reward with a long way up.** Exact match of the whole list; the base model's slips are spread over
  positions and lengths, so RL has to fix each, not one habit.
- **Held-out lists.** A fixed random set of digit lists never appears in pretraining or RL prompts: held-out
  accuracy measures whether sorting was learned.

The base model (`build_sorting_model`) is pretrained like the demo's: it has seen sorted lists, and the task's
format with the right answer only for ``correct_fraction`` of the lines; the rest carry one slip (two neighbours
swapped, or one digit repeated in place of another), so it sorts sloppily and RL has to make the right answer
its habit.

The pretraining settings set where RL starts. With 1,500 steps and ``correct_fraction`` 0.2 the base model answers
~0.9 of the held-out lists right greedily but only ~0.3 when it samples at T = 1 (at ``correct_fraction`` 0.1 /
0.3: 0.26 / 0.34), so the bench measures held-out accuracy by sampling (`rllib_p3o.tasks.bench_config`), and
on-policy P3O lifts it over tens of iterations, not a few. The claims bench (``rllib-p3o sweep --task sorting``)
runs on it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from rllib_p3o.tasks.splits import HeldOutSplit

_LIST = re.compile(r"^\s*(\d(?:,\d)*)")


def sorting_reward(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_) -> List[float]:
    """Verifier reward (TRL's batched signature): 1.0 if the completion starts with exactly the sorted list."""
    out = []
    for completion, expected in zip(completions, answer):
        m = _LIST.match(completion)
        out.append(1.0 if m is not None and m.group(1) == expected else 0.0)
    return out


@dataclass(frozen=True)
class SortingTask(HeldOutSplit):
    """Lists of ``min_len``-``max_len`` digits (0-9, repeats allowed); ``num_rows`` distinct lists, drawn by
    ``seed``, of which ``num_heldout`` are held out."""

    min_len: int = 4
    max_len: int = 7
    num_rows: int = 20000
    num_heldout: int = 300
    seed: int = 0

    @staticmethod
    def prompt(digits: Sequence[int]) -> str:
        return "sort:" + ",".join(map(str, digits)) + "="

    @staticmethod
    def answer(digits: Sequence[int]) -> str:
        return ",".join(map(str, sorted(digits)))

    def _lists(self) -> List[tuple]:
        rng = random.Random(self.seed)
        seen: Dict[tuple, None] = {}
        while len(seen) < self.num_rows:
            n = rng.randint(self.min_len, self.max_len)
            seen.setdefault(tuple(rng.randrange(10) for _ in range(n)))
        return list(seen)

    def _rows(self) -> List[Dict[str, str]]:
        return [{"prompt": self.prompt(d), "answer": self.answer(d)} for d in self._lists()]

    @staticmethod
    def slip(digits: Sequence[int], rng: random.Random) -> str:
        """The sorted list with one slip: two neighbours swapped, or one digit written where another belongs. Never
        the right answer (a swap of equal neighbours is replaced by a changed digit)."""
        out = sorted(digits)
        i = rng.randrange(len(out) - 1)
        if out[i] != out[i + 1] and rng.random() < 0.5:
            out[i], out[i + 1] = out[i + 1], out[i]
        else:
            j = rng.randrange(len(out))
            out[j] = (out[j] + rng.choice([1, 9])) % 10
        return ",".join(map(str, out))

    def pretraining_corpus(
        self, format_fraction: float = 0.5, correct_fraction: float = 0.2, seed: int = 0
    ) -> List[str]:
        """Sorted lists ``"1,3,4,7,9"`` of the training lists, plus the task's format for ``format_fraction`` of
        them, right in ``correct_fraction`` of those lines and with one `slip` in the others. No held-out list."""
        rows = self.train_rows()
        digits = [[int(c) for c in r["prompt"][5:-1].split(",")] for r in rows]
        rng = random.Random(seed)
        order = list(range(len(rows)))
        rng.shuffle(order)
        formatted = order[: round(format_fraction * len(rows))]
        num_correct = round(correct_fraction * len(formatted))
        lines = [r["answer"] for r in rows]
        lines += [rows[i]["prompt"] + rows[i]["answer"] for i in formatted[:num_correct]]
        lines += [rows[i]["prompt"] + self.slip(digits[i], rng) for i in formatted[num_correct:]]
        return lines

    def corpus(self) -> List[str]:
        """Text the tokenizer is trained on."""
        return ["sort:" + ",".join(str(d) for d in range(10)) + "="]


def build_sorting_model(
    path: str,
    *,
    task: Optional[SortingTask] = None,
    pretrain_steps: int = 1500,
    seed: int = 0,
    format_fraction: float = 0.5,
    correct_fraction: float = 0.2,
    overwrite: bool = False,
    progress: Optional[Callable[[int, float], None]] = None,
) -> str:
    """The bench's base model: a tiny Qwen2 (`build_tiny_model`) pretrained on `SortingTask.pretraining_corpus`.
    Cached like the demo's: a directory built with the same settings (and torch thread count) is reused."""
    from rllib_p3o.tasks.tiny_model import build_bench_model

    return build_bench_model(
        path,
        task or SortingTask(),
        pretrain_steps=pretrain_steps,
        seed=seed,
        format_fraction=format_fraction,
        correct_fraction=correct_fraction,
        overwrite=overwrite,
        progress=progress,
    )
