"""Online sampling for one training step, synchronous or asynchronous, and the staleness of what is sampled.

Staleness of a record = weights versions between the policy that sampled it and the learner's current weights
(``weights_seq_no`` at the learner - ``weights_seq_no`` of the record). Only the policy's own records have one; the
others (behavior models) get -1, as offline rows do.

Sync mode: every runner samples its share with the latest weights (they were synced after the last update), so
staleness is 0.

Async mode: runners never stop generating; each runner's ``sample()`` result is one *chunk* (its prompt groups,
all generated with one weights version: a runner loads new weights between two samples, never during one). The
learner takes whole chunks, oldest first, until it has enough records. The drop rule (`StaleChunkQueue`): a chunk
whose newest policy weights are more than ``max_staleness`` versions behind the learner is dropped whole and
counted, so prompt groups stay whole and the learner never trains on policy samples older than that bound. A chunk
without policy records (behavior models only) is never stale.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Dict, Iterable, List, Tuple

from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o import metrics
from rllib_p3o.columns import Record
from rllib_p3o.engine_runners import EngineRunners
from rllib_p3o.episodes import episodes_to_records
from rllib_p3o.p3o_config import P3OConfig
from rllib_p3o.sources import is_policy

CompletionRecord = Dict[str, Any]
# RLlib's tag of the runners' in-flight sample() calls.
SAMPLE_TAG = "sample"
# How long one wait for finished samples lasts before the sampler checks its time limit again (seconds).
_POLL_S = 0.02


def set_staleness(records: Iterable[CompletionRecord], weights_seq_no: int) -> None:
    """Set each record's staleness: ``weights_seq_no - record's weights_seq_no`` for the policy's, -1 for others."""
    for r in records:
        r[Record.STALENESS] = weights_seq_no - r[Record.WEIGHTS_SEQ_NO] if is_policy(r[Record.SOURCE_ID]) else -1


def chunk_staleness(chunk: Iterable[CompletionRecord], weights_seq_no: int) -> int:
    """Versions between the learner and the newest policy weights in ``chunk``; 0 for a chunk without policy records."""
    newest = max((r[Record.WEIGHTS_SEQ_NO] for r in chunk if is_policy(r[Record.SOURCE_ID])), default=None)
    return weights_seq_no - newest if newest is not None else 0


class StaleChunkQueue:
    """Chunks of completion records waiting for the learner, oldest first, with the async drop rule (module doc).

    Pure Python: no Ray. ``take`` hands out whole chunks; what it does not need stays queued for the next step (and
    may turn stale there).
    """

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self._chunks: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self._chunks)

    def put(self, chunk: List[CompletionRecord]) -> None:
        self._chunks.append(chunk)

    def take(self, need: int, weights_seq_no: int) -> Tuple[List[CompletionRecord], int]:
        """Whole fresh chunks, oldest first, until at least ``need`` records (or the queue is empty).

        Returns the records taken (their staleness set) and the number of records dropped as stale on the way.
        """
        taken: List[CompletionRecord] = []
        dropped = 0
        while self._chunks and len(taken) < need:
            chunk = self._chunks.popleft()
            if chunk_staleness(chunk, weights_seq_no) > self.max_staleness:
                dropped += len(chunk)
                continue
            set_staleness(chunk, weights_seq_no)
            taken += chunk
        return taken, dropped


class Sampler:
    """Completion records from the runners for one training step (sync or async, per ``config.async_sampling``).

    Uses the config's ``async_sampling``, ``max_staleness`` and ``sample_timeout_s``. Runner metrics are aggregated
    into ``metrics_logger`` under ``env_runners``; async mode also logs the learner's wait for data and the stale
    records dropped under ``p3o``.
    """

    def __init__(self, config: P3OConfig, runners: EngineRunners, metrics_logger: MetricsLogger):
        self.config = config
        self.runners = runners
        self.metrics = metrics_logger
        self.queue = StaleChunkQueue(config.max_staleness)
        self.dropped_stale_lifetime = 0

    def sample(self, num_records: int, weights_seq_no: int) -> List[CompletionRecord]:
        """At least ``num_records`` completion records (exactly that many in sync mode), staleness set."""
        if self.config.async_sampling:
            return self._sample_async(num_records, weights_seq_no)
        episodes, runner_metrics = synchronous_parallel_sample(
            worker_set=self.runners.group,
            max_env_steps=num_records,
            sample_timeout_s=self.config.sample_timeout_s,
            _uses_new_env_runners=True,
            _return_metrics=True,
        )
        if not episodes:
            raise RuntimeError("No completions were sampled: an EnvRunner failed (see the errors above) or sampling "
                               f"took longer than sample_timeout_s={self.config.sample_timeout_s}.")
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        records = episodes_to_records(episodes)
        set_staleness(records, weights_seq_no)
        return records

    def _arm(self) -> None:
        """Keep one sample() in flight on every runner (a runner that has one gets no second)."""
        self.runners.foreach_async(lambda r: (r.sample(), r.get_metrics()), tag=SAMPLE_TAG)

    def _sample_async(self, need: int, weights_seq_no: int) -> List[CompletionRecord]:
        t0 = time.perf_counter()
        taken: List[CompletionRecord] = []
        dropped = 0
        while True:
            got, stale = self.queue.take(need - len(taken), weights_seq_no)
            taken += got
            dropped += stale
            if len(taken) >= need:
                break
            self._arm()
            for _, (episodes, runner_metrics) in self.runners.fetch_ready(SAMPLE_TAG, timeout_s=_POLL_S):
                self.metrics.aggregate([runner_metrics], key=ENV_RUNNER_RESULTS)
                self.queue.put(episodes_to_records(episodes))
            if time.perf_counter() - t0 > self.config.sample_timeout_s:
                raise RuntimeError(f"async sampling produced no usable samples within sample_timeout_s="
                                   f"{self.config.sample_timeout_s} (dropped as stale: {dropped}).")
        self._arm()
        self.dropped_stale_lifetime += dropped
        self._log(metrics.LEARNER_WAIT_FOR_DATA_S, time.perf_counter() - t0)
        self._log(metrics.DROPPED_STALE_SAMPLES, dropped)
        self._log(metrics.DROPPED_STALE_SAMPLES_LIFETIME, self.dropped_stale_lifetime)
        return taken

    def _log(self, key: str, value: float) -> None:
        self.metrics.log_value((metrics.P3O, key), value, window=1)
