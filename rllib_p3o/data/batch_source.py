"""The batch-source interface: where the rows of a training step come from.

`P3O.training_step` asks each of its sources for its rows of the step, concatenates what they return, shuffles the
rows and hands the batch to the learners. Two sources ship: online rollouts from the vLLM runners
(`rllib_p3o.driver.sampler.OnlineSource`) and offline trajectory Parquet through RLlib's offline path (`OfflineSource`,
below). A new source (a replay buffer, another engine, a dataset of preferences turned into rows) implements
`BatchSource`, and `P3O.batch_sources` is where the algorithm builds its list.

A source owns its position in its data: `get_state` goes into the algorithm's checkpoint under `state_key`, and
`set_state` continues from it, so a restored run samples what the uninterrupted run would have.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from rllib_p3o.core import metrics
from rllib_p3o.data.batching import Batch


class SourceBatch(NamedTuple):
    """One source's part of a training step."""

    batch: Batch  # padded learner columns (`rllib_p3o.core.columns`), advantages included
    # The completion records behind ``batch`` where the source has them (online rollouts: for per-iteration metrics
    # such as rewards and lengths); empty for sources whose rows arrive as columns.
    records: List[Dict[str, Any]]


class BatchSource(abc.ABC):
    """A source of training rows (see the module docstring)."""

    #: Key of this source's position in the algorithm's checkpoint (kept stable: old checkpoints restore).
    state_key: str = ""

    @property
    @abc.abstractmethod
    def rows_per_step(self) -> int:
        """Rows this source contributes to each training step."""

    @abc.abstractmethod
    def sample(self, iteration: int, timings: Dict[str, float]) -> SourceBatch:
        """This step's rows. ``iteration``: iterations done before this one. Add the seconds spent, by phase, to
        ``timings`` (keys from `rllib_p3o.core.metrics`, ``time_*_s``)."""

    @property
    def source_names(self) -> Sequence[str]:
        """Data-source names its rows carry beyond the policy's own (per-source metrics; `rllib_p3o.core.sources`)."""
        return ()

    def get_state(self) -> Optional[Any]:
        """Its position, for the checkpoint (None: nothing to save)."""
        return None

    def set_state(self, state: Any) -> Dict[str, float]:
        """Continue from a checkpoint's position; returns metrics to log about the restore."""
        return {}

    def close(self) -> None:
        """Release what is in flight (the trial ends, or a reused Tune actor starts the next one)."""


class OfflineSource(BatchSource):
    """Offline trajectory rows through RLlib's offline path (`rllib_p3o.data.offline_data.P3OOfflineData`)."""

    state_key = "offline_position"

    def __init__(self, offline_data: Any, rows_per_step: int):
        self.offline_data = offline_data
        self._rows_per_step = rows_per_step

    @property
    def rows_per_step(self) -> int:
        return self._rows_per_step

    @property
    def source_names(self) -> Sequence[str]:
        return sorted(getattr(self.offline_data, "source_names", ()))

    def sample(self, iteration: int, timings: Dict[str, float]) -> SourceBatch:
        with metrics.timed(timings, metrics.TIME_OFFLINE_READ_S):
            return SourceBatch(self.offline_data.sample_batch(self._rows_per_step), [])

    def get_state(self) -> Optional[Dict[str, int]]:
        return self.offline_data.get_position()

    def set_state(self, state: Dict[str, int]) -> Dict[str, float]:
        self.offline_data.set_position(state, batch_rows=self._rows_per_step)
        return {}
