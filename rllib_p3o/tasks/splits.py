"""Held-out splits of the built-in tasks: every prompt row, shuffled once by a fixed seed, the first rows held out."""

from __future__ import annotations

import random
from typing import Dict, List


class HeldOutSplit:
    """Mixin of a task dataclass with ``num_heldout`` and ``seed`` fields and a ``_rows()`` method: disjoint
    held-out and training rows, the same on every machine."""

    num_heldout: int
    seed: int

    def _rows(self) -> List[Dict[str, str]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def splits(self) -> Dict[str, List[Dict[str, str]]]:
        """``{"train": rows, "heldout": rows}``: disjoint by prompt; each row has ``prompt`` and ``answer``."""
        rows = self._rows()
        random.Random(self.seed).shuffle(rows)
        return {"heldout": rows[: self.num_heldout], "train": rows[self.num_heldout :]}

    def train_rows(self) -> List[Dict[str, str]]:
        return self.splits()["train"]

    def heldout_rows(self) -> List[Dict[str, str]]:
        return self.splits()["heldout"]
