"""The sampler's staleness rules, without Ray: the async stale-chunk drop rule on a queue of chunks, per-record
staleness, and the async sampling loop against fake runners."""

from types import SimpleNamespace

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o.core import metrics as m
from rllib_p3o.core.columns import Record
from rllib_p3o.core.sources import POLICY, source_id
from rllib_p3o.data.episodes import completion_episode
from rllib_p3o.data.prompt_schedule import PromptSchedule
from rllib_p3o.driver.sampler import Sampler, StaleChunkQueue, chunk_staleness, set_staleness, split_groups

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
    assert len(dropped) == 4 and len(q) == 0
    assert [r[Record.STALENESS] for r in taken] == [2, 2, -1, -1, 0, 0, -1, -1]
    assert [r[Record.WEIGHTS_SEQ_NO] for r in taken if r[Record.SOURCE_ID] != BEHAVIOR] == [3, 3, 5, 5]


def test_chunks_are_never_split_and_the_rest_waits_and_may_turn_stale():
    q = StaleChunkQueue(max_staleness=1)
    for version in (4, 4, 4):
        q.put(_chunk(version))
    taken, dropped = q.take(need=5, weights_seq_no=4)  # one chunk has 4 records: a second is taken whole
    assert (len(taken), len(dropped), len(q)) == (8, 0, 1)
    # Two updates later the waiting chunk is 2 versions behind: dropped when it is next taken.
    taken, dropped = q.take(need=4, weights_seq_no=6)
    assert (taken, len(dropped), len(q)) == ([], 4, 0)


def test_take_needs_nothing_or_finds_nothing():
    q = StaleChunkQueue(max_staleness=0)
    assert q.take(need=4, weights_seq_no=0) == ([], [])
    q.put(_chunk(0))
    assert q.take(need=0, weights_seq_no=0) == ([], []) and len(q) == 1


class _FakeRunners:
    """Stands in for `EngineRunners` over one remote runner (this test is about the sampler, not Ray): each armed
    sample() finishes with the next chunk, whatever groups it was given."""

    def __init__(self, versions, policy=2, behavior=2):
        self.pending = [self._episodes(v, policy, behavior) for v in versions]
        self.armed = 0
        self.in_flight = False

    @staticmethod
    def _episodes(version, policy, behavior):
        def ep(source, v, group):
            return completion_episode(
                prompt_ids=[1, 2],
                completion_ids=[3],
                behavior_logprobs=[-0.1],
                reward=1.0,
                weights_seq_no=v,
                group_id=group,
                source_id=source_id(source),
            )

        return [ep(POLICY, version, g) for g in range(policy)] + [ep("behavior/frozen", 0, g) for g in range(behavior)]

    def healthy_ids(self):
        return [1]

    def num_runners(self):
        return 1

    def start(self, fns, tag):
        assert tag == "sample"
        if fns and not self.in_flight:
            self.armed += 1
            self.in_flight = True

    def fetch_ready(self, tag, timeout_s):
        if not (self.in_flight and self.pending):
            return []
        self.in_flight = False
        return [(1, (self.pending.pop(0), {}, None))]


def _sampler(runners, max_staleness=1, timeout=5.0):
    config = SimpleNamespace(
        async_sampling=True,
        max_staleness=max_staleness,
        sample_timeout_s=timeout,
        online_prompts_per_step=2,
        group_size=4,
    )
    return Sampler(config, runners, MetricsLogger(), PromptSchedule(num_rows=10))


def test_async_sampler_drops_stale_chunks_logs_and_rearms():
    runners = _FakeRunners(versions=[1, 3, 4])
    sampler = _sampler(runners, max_staleness=1)
    records = sampler.sample(weights_seq_no=4)
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
        sampler.sample(weights_seq_no=3)


class _DyingRunners:
    """Stands in for `EngineRunners` over runners 1-3 (this test is about the sampler, not Ray): runner 2 dies on
    its first call; the others return one episode per completion of the groups they were given."""

    def __init__(self):
        self.healthy = [1, 2, 3]
        self.calls = []

    def healthy_ids(self):
        return list(self.healthy)

    def num_runners(self):
        return 3

    def call(self, fns, timeout_s=None):
        self.calls.append(sorted(fns))
        out = {}
        for i, fn in fns.items():
            if i == 2 and 2 in self.healthy:
                self.healthy.remove(2)
                continue
            out[i] = fn(SimpleNamespace(sample=self._sample, get_metrics=lambda: {}, take_probe_result=lambda: None))
        return out

    @staticmethod
    def _sample(groups):
        return [
            completion_episode(
                prompt_ids=[1, row],
                completion_ids=[3],
                behavior_logprobs=[-0.1],
                reward=1.0,
                weights_seq_no=1,
                group_id=gid,
                source_id=source_id(POLICY),
            )
            for gid, row, _seed in groups
        ]


def test_sync_sampler_gives_a_dead_runners_groups_to_the_others_and_counts_them():
    runners = _DyingRunners()
    config = SimpleNamespace(
        async_sampling=False, max_staleness=1, sample_timeout_s=5.0, online_prompts_per_step=6, group_size=4
    )
    sampler = Sampler(config, runners, MetricsLogger(), PromptSchedule(num_rows=10, seed=3))
    records = sampler.sample(weights_seq_no=1)
    assert sorted(r[Record.GROUP_ID] for r in records) == list(range(6))  # every group once
    assert runners.calls == [[1, 2, 3], [1, 3]]  # runner 2's two groups went to runners 1 and 3
    logged = sampler.metrics.reduce()[m.P3O]
    assert logged[m.SAMPLES_LOST].peek() == 2 * 4
    assert sampler.schedule.pending == []  # all trained: nothing to sample again after a restore


def test_every_runner_result_is_verified_before_its_records_are_used():
    """The weight-sync check (`WeightSync.verify`, faked here: the test is about the sampler) sees each runner's
    result with the policy weights versions in it, and what it raises stops the step."""
    seen = []
    config = SimpleNamespace(
        async_sampling=False, max_staleness=1, sample_timeout_s=5.0, online_prompts_per_step=6, group_size=4
    )
    sampler = Sampler(
        config,
        _DyingRunners(),
        MetricsLogger(),
        PromptSchedule(num_rows=10, seed=3),
        verify=lambda i, probe, versions: seen.append((i, probe, versions)),
    )
    assert len(sampler.sample(weights_seq_no=1)) == 6  # the fake runners return one episode per group
    assert sorted(i for i, _, _ in seen) == [1, 1, 3, 3] and all(v == {1} for _, _, v in seen)

    def refuse(i, probe, versions):
        raise RuntimeError(f"runner {i} unverified")

    sampler = Sampler(config, _DyingRunners(), MetricsLogger(), PromptSchedule(num_rows=10, seed=3), verify=refuse)
    with pytest.raises(RuntimeError, match="runner 1 unverified"):
        sampler.sample(weights_seq_no=1)


def test_split_groups_is_contiguous_and_near_equal():
    groups = PromptSchedule(num_rows=10).take(5)
    plan = split_groups(groups, [1, 4])
    assert [len(plan[1]), len(plan[4])] == [3, 2] and plan[1] + plan[4] == groups
    assert split_groups(groups[:1], [1, 2, 3]) == {1: groups[:1]}


class _SerialRunner:
    """Stands in for `EngineRunners` over one remote runner that runs its calls in order, as a Ray actor does (this
    test is about the sampler's pipeline depth, not Ray): a sample() call is generated with the weights version the
    runner holds when the call's turn comes, and a weight push queued behind sample() calls loads after them. Each
    sample() call finishes at the next poll."""

    def __init__(self, limit: int):
        self.limit = limit
        self.queue = []  # ("sample", groups) or ("load", version), in submission order
        self.version = 0
        self.started = 0

    def healthy_ids(self):
        return [1]

    def num_runners(self):
        return 1

    def start(self, fns, tag):
        if fns and sum(1 for kind, _ in self.queue if kind == "sample") < self.limit:  # RLlib's per-tag limit
            self.queue.append(("sample", self.started))
            self.started += 1

    def push(self, version):
        self.queue.append(("load", version))

    def fetch_ready(self, tag, timeout_s):
        while self.queue and self.queue[0][0] == "load":
            self.version = self.queue.pop(0)[1]
        if not self.queue:
            return []
        _, group = self.queue.pop(0)
        episode = completion_episode(
            prompt_ids=[1, 2],
            completion_ids=[3],
            behavior_logprobs=[-0.1],
            reward=1.0,
            weights_seq_no=self.version,
            group_id=group,
            source_id=source_id(POLICY),
        )
        return [(1, ([episode] * 2, {}, None))]


@pytest.mark.parametrize("requests", [1, 2, 4])
def test_async_data_are_as_many_versions_old_as_sample_calls_in_flight(requests):
    """With k sample() calls in flight per runner (RLlib's ``max_requests_in_flight_per_env_runner``), each weight
    push queues behind k calls, so after a warm-up the learner trains on data k versions old; with k = 1 the data are
    one version old."""
    runner = _SerialRunner(limit=requests)
    config = SimpleNamespace(
        async_sampling=True,
        max_staleness=8,
        sample_timeout_s=5.0,
        online_prompts_per_step=1,
        group_size=2,
        max_requests_in_flight_per_env_runner=requests,
    )
    sampler = Sampler(config, runner, MetricsLogger(), PromptSchedule(num_rows=100))
    staleness = []
    for version in range(12):
        records = sampler.sample(weights_seq_no=version)
        staleness.append(max(r[Record.STALENESS] for r in records))
        runner.push(version + 1)  # the learner's update, pushed without waiting (async mode)
    assert staleness[-4:] == [requests] * 4
    assert sum(len(calls) for calls in sampler._in_flight.values()) == requests  # the pipeline stays full
