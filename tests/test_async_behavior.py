"""Async sampling with bounded staleness, and frozen behavior models mixed into prompt groups (real Ray + vLLM)."""

import os
from collections import Counter, defaultdict

import pyarrow.parquet as pq
import pytest
import torch
from helpers import tiny_config

from rllib_p3o.core import metrics as m
from rllib_p3o.core.sources import POLICY
from rllib_p3o.tasks import build_tiny_model


def _config(model, **training):
    return tiny_config(model, rows=400, max_tokens=3, **training)


@pytest.fixture(scope="module")
def sync_run_with_a_behavior_model(ray_session, tiny_model, tiny_untied_model, tmp_path_factory):
    """One sync iteration with a frozen behavior model writing 3 of each group's 4 completions at its own temperature,
    recorded: (the iteration's result, its recorded rows). The tests below check different things of this one run."""
    record = tmp_path_factory.mktemp("behavior_share")
    cfg = _config(
        tiny_model,
        behavior_models=[{"model": tiny_untied_model, "name": "frozen", "samples": 3, "temperature": 1.3}],
        record_rollouts=str(record),
    )
    algo = cfg.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    return result, pq.read_table(os.path.join(record, "part-0000000.parquet")).to_pylist()


def test_behavior_model_takes_its_share_of_every_group(sync_run_with_a_behavior_model):
    _, rows = sync_run_with_a_behavior_model
    groups = defaultdict(Counter)
    for r in rows:
        groups[r["group_id"]][r["source"]] += 1
    assert len(groups) == 8
    for counts in groups.values():
        assert counts == {POLICY: 1, "behavior/frozen": 3}
    frozen = [r for r in rows if r["source"] == "behavior/frozen"]
    assert {round(r["temperature"], 4) for r in frozen} == {1.3}
    assert {round(r["temperature"], 4) for r in rows if r["source"] == POLICY} == {1.0}


def test_async_run_with_behavior_model(ray_session, tiny_model, tiny_untied_model):
    cfg = _config(
        tiny_model,
        async_sampling=True,
        max_staleness=1,
        behavior_models=[{"model": tiny_untied_model, "name": "frozen", "share": 0.5}],
    )
    algo = cfg.build_algo()
    try:
        results = [algo.train() for _ in range(5)]
        # Disjoint thread budgets: the runner's engine and the (local) learner one thread each (their Ray CPUs).
        runner_threads = algo._runners.call({1: lambda runner: torch.get_num_threads()})[1]
        learner_threads = torch.get_num_threads()  # the local learner lives in this process
    finally:
        algo.stop()
    assert (runner_threads, learner_threads) == (cfg.env_runner_threads, cfg.learner_threads) == (1, 1)
    p = [r[m.P3O] for r in results]
    # The driver's part of the weight sync (its runners' part comes back with the next push).
    assert all(x[m.SYNC_PREFIX + m.GATHER_S] > 0 and x[m.SYNC_PREFIX + m.SYNC_BYTES] > 0 for x in p)
    assert m.SYNC_PREFIX + m.ENGINE_RELOAD_S in p[-1]
    assert all(x[m.STALENESS_MAX] <= 1 for x in p)
    assert any(x[m.STALENESS_MEAN] > 0 for x in p)  # samples from older policy versions were trained on
    assert all(m.DROPPED_STALE_SAMPLES in x and m.LEARNER_WAIT_FOR_DATA_S in x for x in p)
    by_source = p[-1][m.BY_SOURCE]
    assert set(by_source) == {POLICY, "behavior/frozen"}
    assert by_source[POLICY][m.NUM_COMPLETIONS] == by_source["behavior/frozen"][m.NUM_COMPLETIONS]
    for stats in by_source.values():
        assert {m.REWARD_MEAN, m.COMPLETION_LEN_MEAN, m.ESS, m.CAP_FRACTION, m.KL_BEHAVIOR} <= set(stats)
    # The frozen model is far from the policy (other weights): its tokens are off-policy, the policy's are not.
    assert by_source["behavior/frozen"][m.ESS] < by_source[POLICY][m.ESS]
    assert m.BY_STALENESS in m.lookup(results[-1], *m.LEARNER)
    assert m.IDLE_TIME_S in results[-1]["env_runners"]


def test_sync_run_drops_nothing_and_reports_zero_staleness(sync_run_with_a_behavior_model):
    result, _ = sync_run_with_a_behavior_model
    assert result[m.P3O][m.STALENESS_MAX] == 0


def test_behavior_model_with_another_tokenizer_fails_at_start(tiny_model, tmp_path):
    other = build_tiny_model(
        str(tmp_path / "other_tok"), corpus=["completely different text " * 5, "abc xyz"], vocab_size=40
    )
    with pytest.raises(
        ValueError,
        match=rf"behavior model {other} uses a different tokenizer than the policy model "
        rf"{tiny_model}",
    ):
        _config(tiny_model, behavior_models=[{"model": other, "samples": 2}]).validate()


def test_async_data_are_as_old_as_the_sample_calls_in_flight(ray_session, tiny_model):
    """RLlib's ``max_requests_in_flight_per_env_runner`` sets the async pipeline's depth: each weight push queues in
    the runner behind its calls in flight, so with 3 the learner trains on data up to 3 versions old, and
    ``max_staleness=3`` keeps anything older out. How old each batch is depends on when a push lands between calls
    (the sweep measured 2.85 versions on average at 4 in flight; on a loaded machine a call can come back a version
    later and is dropped), so the test bounds the ages and checks that the pipeline is as deep as asked."""
    cfg = _config(tiny_model, async_sampling=True, max_staleness=3).env_runners(max_requests_in_flight_per_env_runner=3)
    algo = cfg.build_algo()
    try:
        p = [algo.train()[m.P3O] for _ in range(6)]
    finally:
        algo.stop()
    ages = [x[m.STALENESS_MAX] for x in p]
    assert ages[0] == 0 and max(ages) == 3 and all(a <= 3 for a in ages), ages
    assert all(later <= earlier + 1 for earlier, later in zip(ages, ages[1:])), ages  # one version per iteration
    # Deeper than one call in flight (whose data are at most 1 version old): the later batches are mostly older.
    assert sum(x[m.STALENESS_MEAN] for x in p[3:]) / 3 >= 1.5, [x[m.STALENESS_MEAN] for x in p]
