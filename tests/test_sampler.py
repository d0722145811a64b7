"""The sampler's staleness rules, without Ray: the async stale-chunk drop rule on a queue of chunks, per-record
staleness, and the async sampling loop against fake runners."""

from types import SimpleNamespace

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o import metrics as m
from rllib_p3o.columns import Record
from rllib_p3o.engine_runners import EngineRunners
from rllib_p3o.episodes import completion_episode
from rllib_p3o.sampler import Sampler, StaleChunkQueue, chunk_staleness, set_staleness
from rllib_p3o.sources import POLICY, source_id

BEHAVIOR = source_id("behavior/frozen")


def _records(version, n=2, source=POLICY):
    return [{Record.WEIGHTS_SEQ_NO: version, Record.SOURCE_ID: source_id(source), "i": i} for i in range(n)]


def _chunk(version, policy=2, behavior=2, behavior_version=0):
    """One runner's sample(): policy records of one weights version, behavior records (never synced: version 0)."""
    return _records(version, policy) + _records(behavior_version, behavior, "behavior/frozen")


def test_set_staleness_policy_records_only():
    records = _records(3) + _records(1) + _records(0, source="behavior/frozen") + _records(5, source="offline/policy")
    set_staleness(records, weights_seq_no=5)
    assert [r[Record.STALENESS] for r in records] == [2, 2, 4, 4, -1, -1, -1, -1]


def test_chunk_staleness_is_that_of_its_newest_policy_records():
    assert chunk_staleness(_records(2) + _records(4), weights_seq_no=6) == 2
    # Behavior records carry version 0 but never make a chunk stale; a chunk of them alone is fresh.
    assert chunk_staleness(_chunk(5, behavior_version=0), weights_seq_no=6) == 1
    assert chunk_staleness(_records(0, source="behavior/frozen"), weights_seq_no=100) == 0


def test_stale_chunk_is_dropped_whole_and_counted_fresh_ones_are_taken_in_order():
    q = StaleChunkQueue(max_staleness=2)
    q.put(_chunk(1))  # 4 behind at version 5: dropped with its behavior records
    q.put(_chunk(3))  # exactly max_staleness behind: kept
    q.put(_chunk(5))
    taken, dropped = q.take(need=8, weights_seq_no=5)
    assert dropped == 4 and len(q) == 0
    assert [r[Record.STALENESS] for r in taken] == [2, 2, -1, -1, 0, 0, -1, -1]
    assert [r[Record.WEIGHTS_SEQ_NO] for r in taken if r[Record.SOURCE_ID] != BEHAVIOR] == [3, 3, 5, 5]


def test_chunks_are_never_split_and_the_rest_waits_and_may_turn_stale():
    q = StaleChunkQueue(max_staleness=1)
    for version in (4, 4, 4):
        q.put(_chunk(version))
    taken, dropped = q.take(need=5, weights_seq_no=4)  # one chunk has 4 records: a second is taken whole
    assert (len(taken), dropped, len(q)) == (8, 0, 1)
    # Two updates later the waiting chunk is 2 versions behind: dropped when it is next taken.
    taken, dropped = q.take(need=4, weights_seq_no=6)
    assert (taken, dropped, len(q)) == ([], 4, 0)


def test_take_needs_nothing_or_finds_nothing():
    q = StaleChunkQueue(max_staleness=0)
    assert q.take(need=4, weights_seq_no=0) == ([], 0)
    q.put(_chunk(0))
    assert q.take(need=0, weights_seq_no=0) == ([], 0) and len(q) == 1


class _FakeRunners:
    """Stands in for an EnvRunnerGroup with remote runners: each armed sample() finishes with the next chunk."""

    def __init__(self, versions, policy=2, behavior=2):
        self.pending = [self._episodes(v, policy, behavior) for v in versions]
        self.armed = 0
        self.in_flight = False

    @staticmethod
    def _episodes(version, policy, behavior):
        def ep(source, v, group):
            return completion_episode(prompt_ids=[1, 2], completion_ids=[3], behavior_logprobs=[-0.1], reward=1.0,
                                      weights_seq_no=v, group_id=group, source_id=source_id(source))
        return ([ep(POLICY, version, g) for g in range(policy)]
                + [ep("behavior/frozen", 0, g) for g in range(behavior)])

    def num_remote_env_runners(self):
        return 1

    def foreach_env_runner_async(self, fn, tag):
        assert tag == "sample"
        if not self.in_flight:  # RLlib's in-flight limit: one sample() per runner
            self.armed += 1
            self.in_flight = True

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        if not (self.in_flight and self.pending):
            return []
        self.in_flight = False
        return [(1, (self.pending.pop(0), {}))]


def _sampler(runners, max_staleness=1, timeout=5.0):
    config = SimpleNamespace(async_sampling=True, max_staleness=max_staleness, sample_timeout_s=timeout)
    return Sampler(config, EngineRunners(runners), MetricsLogger())


def test_async_sampler_drops_stale_chunks_logs_and_rearms():
    runners = _FakeRunners(versions=[1, 3, 4])
    sampler = _sampler(runners, max_staleness=1)
    records = sampler.sample(num_records=8, weights_seq_no=4)
    # The chunk of version 1 (3 behind) is dropped; versions 3 and 4 make the 8 records.
    assert len(records) == 8
    assert sorted(r[Record.STALENESS] for r in records) == [-1, -1, -1, -1, 0, 0, 1, 1]
    logged = sampler.metrics.reduce()[m.P3O]
    assert logged[m.DROPPED_STALE_SAMPLES].peek() == 4 and logged[m.DROPPED_STALE_SAMPLES_LIFETIME].peek() == 4
    assert logged[m.LEARNER_WAIT_FOR_DATA_S].peek() >= 0
    assert runners.in_flight  # re-armed: the runner keeps generating while the learner updates


def test_async_sampler_times_out_when_every_chunk_is_stale():
    sampler = _sampler(_FakeRunners(versions=[0] * 50), max_staleness=0, timeout=0.2)
    with pytest.raises(RuntimeError, match=r"no usable samples within sample_timeout_s=0.2 \(dropped as stale: \d+\)"):
        sampler.sample(num_records=4, weights_seq_no=3)
