"""Which prompt each group samples, and with which seed: one owner on the driver, independent of the runners.

Group ``g`` is the g-th prompt group handed out since training began. Epoch ``e = g // N`` visits the ``N``
prompt rows in the order ``permutation(seed, e)``, so group ``g`` samples row ``order_e[g % N]``, and its sampling
seed is a function of ``(seed, g)`` alone (`group_seed`). Hence which prompt and which completions group ``g`` gets
depends neither on how many runners there are nor on which runner samples it, and a restored run samples at
iteration k+1 what the uninterrupted run samples there.

The data position is then one integer (the next group id) plus the groups handed out but not trained yet
(``pending``: in flight on a runner, queued for the learner, lost with a dead runner or dropped as stale). Pending
groups are handed out again before any new one, so no prompt of an epoch is skipped and none is trained twice.
Pure Python: no Ray.
"""

from __future__ import annotations

import zlib
from typing import Any, Dict, Iterable, List, NamedTuple, Set

import numpy as np


class Group(NamedTuple):
    """One prompt group to sample: its global id, the index of its prompt row and its sampling seed."""

    group_id: int
    row: int
    seed: int


# Seeds derived from a base seed and an index as ``base * SEED_STRIDE + index``: a prime stride above any index a run
# reaches (iterations, episodes of a group), so two (base, index) pairs never share a seed.
SEED_STRIDE = 1_000_003
# The stride between the episodes of one multi-turn group (a prime, so that episodes' seeds do not repeat across
# groups' strides); vLLM takes seeds below 2**31.
EPISODE_SEED_STRIDE = 7919
SEED_MODULUS = 2**31


def episode_seed(group_seed: int, episode: int) -> int:
    """Sampling seed of episode ``episode`` of a multi-turn group whose seed is ``group_seed``."""
    return (int(group_seed) * SEED_STRIDE + episode * EPISODE_SEED_STRIDE) % SEED_MODULUS


def group_seed(seed: int, group_id: int) -> int:
    """Sampling seed of group ``group_id``: ``crc32("seed/group_id")`` (31 bits), the same on every runner."""
    return zlib.crc32(f"{seed}/{group_id}".encode()) & 0x7FFFFFFF


class PromptSchedule:
    """Hands out prompt groups in the seeded per-epoch order and tracks which are done (module docstring)."""

    NEXT_GROUP = "next_group"
    PENDING = "pending"

    def __init__(self, num_rows: int, seed: int = 0):
        if num_rows <= 0:
            raise ValueError("PromptSchedule needs at least one prompt row.")
        self.num_rows = int(num_rows)
        self.seed = int(seed)
        self.next_group = 0
        self._outstanding: Set[int] = set()  # handed out, neither done nor given back
        self._again: List[int] = []  # given back: handed out again first, oldest first
        self._order_epoch = -1
        self._order: np.ndarray = np.empty(0, dtype=np.int64)

    def row(self, group_id: int) -> int:
        """The prompt row of group ``group_id``."""
        epoch, i = divmod(int(group_id), self.num_rows)
        if epoch != self._order_epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            self._order_epoch = epoch
        return int(self._order[i])

    def take(self, k: int) -> List[Group]:
        """The next ``k`` groups: those given back first (oldest first), then new ones."""
        ids = self._again[:k]
        del self._again[:k]
        while len(ids) < k:
            ids.append(self.next_group)
            self.next_group += 1
        self._outstanding.update(ids)
        return [Group(g, self.row(g), group_seed(self.seed, g)) for g in ids]

    def done(self, group_ids: Iterable[int]) -> None:
        """These groups were trained on."""
        self._outstanding.difference_update(int(g) for g in group_ids)

    def give_back(self, group_ids: Iterable[int]) -> int:
        """These groups were not trained on (lost or dropped): hand them out again. Returns how many."""
        back = sorted({int(g) for g in group_ids} & self._outstanding)
        self._outstanding.difference_update(back)
        self._again = sorted(set(self._again) | set(back))
        return len(back)

    @property
    def pending(self) -> List[int]:
        """Groups handed out or given back but not trained on yet, oldest first."""
        return sorted(self._outstanding | set(self._again))

    def get_state(self) -> Dict[str, Any]:
        return {self.NEXT_GROUP: self.next_group, self.PENDING: self.pending}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Continue from ``state``: its pending groups are handed out again first."""
        self.next_group = int(state[self.NEXT_GROUP])
        self._outstanding = set()
        self._again = sorted(int(g) for g in state.get(self.PENDING, ()))
