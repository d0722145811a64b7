"""Batch sources: where the rows of a training step come from, the interface and the two that ship.

`P3O.training_step` asks each of its sources for its rows of the step, concatenates what they return, shuffles the
rows and hands the batch to the learners. Two sources ship: online rollouts from the vLLM runners (`OnlineSource`,
through the `rllib_p3o.driver.sampler.Sampler`) and offline trajectory Parquet through RLlib's offline path
(`OfflineSource`). A new source (a replay buffer, another engine, a dataset of preferences turned into rows)
implements `BatchSource`, and `P3O.batch_sources` is where the algorithm builds its list.

A source owns its share of the step (given when it is built) and its position in its data: `get_state` goes into
the algorithm's checkpoint under `state_key`, and `set_state` continues from it, so a restored run samples what the
uninterrupted run would have.

(Not to be confused with a row's *data source*, the policy or a behavior model that wrote it:
`rllib_p3o.core.sources`.)
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from ray.rllib.utils.metrics import ENV_RUNNER_SAMPLING_TIMER, TIMERS

from rllib_p3o.core import metrics
from rllib_p3o.data import batching
from rllib_p3o.data.batching import Batch
from rllib_p3o.data.recorder import TrajectoryRecorder
from rllib_p3o.driver.sampler import Sampler


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

    def runners_restarted(self, runner_ids: Sequence[int]) -> None:
        """RLlib restarted these runners (their engines start empty): forget what they held. Nothing by default."""

    def close(self) -> None:
        """Release what is in flight (the trial ends, or a reused Tune actor starts the next one)."""


class OnlineSource(BatchSource):
    """Online rollouts as a batch source: the `Sampler`'s records of one step, with group-normalized advantages
    (over whole prompt groups, before the batch is sharded over learners), recorded if asked, padded.

    ``weights_seq_no()`` gives the learner's current weights version (staleness is measured against it).
    """

    state_key = "sampler"

    def __init__(
        self,
        sampler: Sampler,
        weights_seq_no: Callable[[], int],
        pad_id: int,
        recorder: Optional[TrajectoryRecorder] = None,
    ):
        self.sampler = sampler
        self.weights_seq_no = weights_seq_no
        self.pad_id = pad_id
        self.recorder = recorder

    def sample(self, iteration: int, timings: Dict[str, float]) -> SourceBatch:
        with (
            metrics.timed(timings, metrics.TIME_GENERATE_S),
            self.sampler.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)),
        ):
            records = self.sampler.sample(self.weights_seq_no())
        with metrics.timed(timings, metrics.TIME_BATCHING_S):
            batching.add_group_advantages(records)
            if self.recorder is not None:
                self.recorder.write(records, iteration=iteration)
            return SourceBatch(batching.pad_records(records, pad_id=self.pad_id), records)

    def get_state(self) -> Dict[str, Any]:
        return self.sampler.get_state()

    def set_state(self, state: Dict[str, Any]) -> Dict[str, float]:
        return {metrics.GROUPS_RESAMPLED_AFTER_RESTORE: self.sampler.set_state(state)}

    def close(self) -> None:
        self.sampler.drain()

    def runners_restarted(self, runner_ids: Sequence[int]) -> None:
        self.sampler.forget_runners(runner_ids)


class OfflineSource(BatchSource):
    """Offline trajectory rows through RLlib's offline path (`rllib_p3o.data.offline_data.P3OOfflineData`),
    ``rows_per_step`` of them each step."""

    state_key = "offline_position"

    def __init__(self, offline_data: Any, rows_per_step: int):
        self.offline_data = offline_data
        self.rows_per_step = rows_per_step

    @property
    def source_names(self) -> Sequence[str]:
        return sorted(getattr(self.offline_data, "source_names", ()))

    def sample(self, iteration: int, timings: Dict[str, float]) -> SourceBatch:
        with metrics.timed(timings, metrics.TIME_OFFLINE_READ_S):
            return SourceBatch(self.offline_data.sample_batch(self.rows_per_step), [])

    def get_state(self) -> Optional[Dict[str, int]]:
        return self.offline_data.get_position()

    def set_state(self, state: Dict[str, int]) -> Dict[str, float]:
        self.offline_data.set_position(state, batch_rows=self.rows_per_step)
        return {}
