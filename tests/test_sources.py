"""Data sources and their names (`rllib_p3o.core.sources`) and the metric keys (`rllib_p3o.core.metrics`), without Ray."""

import numpy as np
import torch

from rllib_p3o.core import metrics as m
from rllib_p3o.core.columns import Record
from rllib_p3o.core.losses.grpo import grpo_loss
from rllib_p3o.core.losses.p3o import p3o_loss
from rllib_p3o.core.sources import (
    POLICY,
    SourceNames,
    behavior_sample_counts,
    behavior_source_name,
    is_policy,
    offline_source_name,
    source_id,
)


def test_policy_is_source_zero_and_other_names_get_stable_distinct_ids():
    assert source_id(POLICY) == 0 and is_policy(0) and is_policy(np.int64(0))
    names = ["behavior/a", "behavior/b", "offline", "offline/policy", "offline/behavior/a"]
    ids = [source_id(n) for n in names]
    assert len(set(ids)) == len(ids) and 0 not in ids and not any(is_policy(i) for i in ids)
    assert ids == [source_id(n) for n in names]  # a hash of the name: the same in every process


def test_offline_names_keep_replayed_policy_data_apart():
    assert offline_source_name(POLICY) == "offline/policy"
    assert offline_source_name("behavior/x") == "offline/behavior/x"
    assert offline_source_name(None) == offline_source_name("") == "offline"


def test_behavior_names_and_their_share_of_a_group():
    assert behavior_source_name({"model": "/models/qwen-small/", "samples": 2}) == "behavior/qwen-small"
    assert behavior_source_name({"model": "/models/x", "name": "teacher"}) == "behavior/teacher"
    assert behavior_sample_counts([{"samples": 3}, {"share": 0.25}, {}], group_size=8) == [3, 2, 4]


def test_source_names_map_ids_back():
    names = SourceNames(["behavior/teacher", offline_source_name(POLICY)])
    assert names.name(0) == POLICY
    assert names.name(source_id("offline/policy")) == "offline/policy"
    assert names.name(np.int64(source_id("behavior/teacher"))) == "behavior/teacher"
    assert names.name(12345) == "source_12345"


def test_metric_keys_are_the_objectives_own():
    g = torch.Generator().manual_seed(0)
    logp, behavior = -torch.rand(2, 3, generator=g), -torch.rand(2, 3, generator=g)
    args = (logp, behavior, torch.tensor([1.0, -1.0]), torch.ones(2, 3))
    p3o_keys, grpo_keys = set(p3o_loss(*args)[1]), set(grpo_loss(*args)[1])
    assert {
        m.ESS,
        m.CAP_FRACTION,
        m.KL_BEHAVIOR,
        m.KL_WEIGHT,
        m.RATIO_MEAN,
        m.RATIO_MAX,
        m.PG_LOSS,
        m.LOSS,
        m.NUM_TOKENS,
    } <= p3o_keys
    assert {m.ESS, m.CLIP_FRACTION, m.LOSS} <= grpo_keys
    assert m.column(*m.LEARNER, m.ESS) == "learners/default_policy/ess"
    assert m.lookup({"a": {"b": 1}}, "a", "b") == 1 and m.lookup({"a": {}}, "a", "b") is None


def test_the_screens_tokens_per_s_is_a_window_that_an_iteration_with_its_samples_ready_cannot_spike():
    """Issue 63: async rows showed 13,622 and 107,282 tokens/s on a machine that generates about 1,000: each
    iteration's tokens over the time the driver waited for them, near 0 when the runners had generated ahead."""
    assert dict(m.SUMMARY)[m.TOKENS_PER_S] == (m.P3O, m.RECENT_TOKENS_PER_S)
    rate = m.TokenRate(window=5)
    # 1,000 tokens an iteration, generated at 1,000 tokens/s beside training; the third had its samples ready.
    rates = [rate.add(1000, seconds) for seconds in (1.0, 1.2, 0.01, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)]
    assert max(rates) < 1.4 * 1000 and min(rates) > 0.8 * 1000, rates
    assert rates[-1] == 1000.0  # the ready iteration has left the window


def test_step_metrics_and_per_source_figures():
    records = [
        {
            Record.COMPLETION_IDS: [1] * n,
            Record.REWARD: r,
            Record.GROUP_ID: g,
            Record.SOURCE_ID: s,
            Record.STALENESS: st,
        }
        for n, r, g, s, st in [(2, 1.0, 0, 0, 1), (4, 0.0, 0, 0, 1), (1, 1.0, 1, 7, -1), (1, 1.0, 1, 7, -1)]
    ]
    batch = {"completion_mask": np.ones((4, 3))}
    timings = {m.TIME_GENERATE_S: 2.0, m.TIME_TRAIN_S: 4.0}
    step = m.step_metrics(
        records, batch, timings, {m.PROBE_MAX_ABS_DIFF: 1e-6}, [0.5, 0.5], num_offline_rows=0, weights_seq_no=3
    )
    assert step[m.GENERATED_TOKENS] == 8 and step[m.GENERATED_TOKENS_PER_S] == 4.0
    assert step[m.TRAINED_TOKENS] == 12 and step[m.TRAINED_TOKENS_PER_S] == 3.0
    assert step[m.GROUPS_WITHOUT_SIGNAL] == 0.5  # group 1 has equal rewards
    assert (step[m.STALENESS_MEAN], step[m.STALENESS_MAX]) == (1.0, 1)  # the policy's records only
    assert step[m.SYNC_PROBE_MAX_ABS_DIFF] == 1e-6 and step[m.ESS_SPREAD_ACROSS_LEARNERS] == 0.0
    assert m.OFFLINE_ROWS_SKIPPED not in step
    by = m.records_by_source(records, SourceNames())
    assert by[(POLICY, m.NUM_COMPLETIONS)] == 2 and by[(POLICY, m.COMPLETION_LEN_MEAN)] == 3.0
    assert by[("source_7", m.REWARD_MEAN)] == 1.0
