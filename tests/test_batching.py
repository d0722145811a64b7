"""The learner batch format (`rllib_p3o.core.columns`), built from completion records by `rllib_p3o.data.batching`, without
Ray: alignment of completion tokens and behavior log-probs, padding, and online + offline parts concatenated."""

from types import SimpleNamespace

import numpy as np
import pytest

from rllib_p3o.core.columns import BATCH_COLUMNS, DTYPES, Columns, Record
from rllib_p3o.core.sources import source_id
from rllib_p3o.data import batching
from rllib_p3o.data.episodes import completion_episode, episodes_to_records
from rllib_p3o.data.offline_data import P3OOfflinePreLearner

PAD = 0


def _record(prompt, completion, advantage=0.5, **extra):
    behavior = [-0.1 * (j + 1) for j in range(len(completion))]
    return {
        Record.PROMPT_IDS: np.asarray(prompt),
        Record.COMPLETION_IDS: np.asarray(completion),
        Record.BEHAVIOR_LOGPROBS: np.asarray(behavior, np.float32),
        Record.ADVANTAGE: advantage,
        **extra,
    }


def test_completion_tokens_and_their_behavior_logprobs_sit_on_the_target_positions():
    records = [
        _record([5, 6, 7], [8, 9]),
        _record([5], [4, 3, 2, 1], advantage=-1.0, weights_seq_no=3, source_id=9, staleness=1),
    ]
    b = batching.pad_records(records, pad_id=PAD)
    assert list(b) == list(BATCH_COLUMNS) and all(b[k].dtype == DTYPES[k] for k in b)
    np.testing.assert_array_equal(b[Columns.INPUT_IDS], [[5, 6, 7, 8, 9], [5, 4, 3, 2, 1]])
    np.testing.assert_array_equal(b[Columns.ATTENTION_MASK], [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    # Target t is input_ids[t + 1]: row 0's completion (8, 9) is targets 2-3, row 1's (4, 3, 2, 1) targets 0-3.
    np.testing.assert_array_equal(b[Columns.COMPLETION_MASK], [[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_allclose(b[Columns.BEHAVIOR_LOGPROBS], [[0, 0, -0.1, -0.2], [-0.1, -0.2, -0.3, -0.4]])
    np.testing.assert_array_equal(b[Columns.ADVANTAGES], [0.5, -1.0])
    # Defaults: the policy's version 0, source 0 (the policy), staleness -1 (not applicable).
    np.testing.assert_array_equal(b[Columns.WEIGHTS_SEQ_NO], [0, 3])
    np.testing.assert_array_equal(b[Columns.SOURCE_ID], [0, 9])
    np.testing.assert_array_equal(b[Columns.STALENESS], [-1, 1])


def test_short_rows_are_padded_with_the_pad_id_and_masked():
    b = batching.pad_records([_record([5, 6], [8]), _record([5, 6, 7], [8, 9, 4])], pad_id=63, pad_to=8)
    np.testing.assert_array_equal(b[Columns.INPUT_IDS][0], [5, 6, 8, 63, 63, 63, 63, 63])
    np.testing.assert_array_equal(b[Columns.ATTENTION_MASK][0], [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b[Columns.COMPLETION_MASK][0], [0, 1, 0, 0, 0, 0, 0])
    assert batching.real_width(b) == 6


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="2 behavior log-probs for 3 completion tokens"):
        batching.pad_records([dict(_record([1], [2, 3, 4]), behavior_logprobs=[-1.0, -1.0])], pad_id=PAD)
    with pytest.raises(ValueError, match="more than pad_to=3"):
        batching.pad_records([_record([1, 2], [3, 4])], pad_id=PAD, pad_to=3)
    with pytest.raises(ValueError, match="no completion records"):
        batching.pad_records([], pad_id=PAD)


def _assert_batches_equal(a, b):
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert a[k].dtype == b[k].dtype, k


def test_online_and_fixed_width_offline_parts_concatenate_as_if_padded_together():
    online = [_record([1, 2, 3], [4, 5]), _record([1, 2, 3], [6])]
    offline = [_record([7, 8], [9, 9, 9, 9], advantage=2.0, source_id=11), _record([7], [9], source_id=11)]
    parts = [batching.pad_records(online, pad_id=PAD), batching.pad_records(offline, pad_id=PAD, pad_to=16)]
    _assert_batches_equal(batching.concat_padded(parts, pad_id=PAD), batching.pad_records(online + offline, PAD))
    # The other way round: the online part is the wider one, the offline part is padded up, not cut.
    long_online = [_record([1, 2, 3, 4, 5, 6, 7], [8, 9])]
    parts = [batching.pad_records(long_online, pad_id=PAD), batching.pad_records(offline, pad_id=PAD, pad_to=16)]
    _assert_batches_equal(batching.concat_padded(parts, pad_id=PAD), batching.pad_records(long_online + offline, PAD))


def test_offline_only_batch_loses_its_padding_and_an_empty_part_changes_nothing():
    offline = [_record([7, 8], [9, 9, 9])]
    fixed = batching.pad_records(offline, pad_id=PAD, pad_to=16)
    _assert_batches_equal(batching.concat_padded([fixed], pad_id=PAD), batching.pad_records(offline, PAD))
    online = batching.pad_records([_record([1], [2, 3])], pad_id=PAD)
    _assert_batches_equal(batching.concat_padded([online, batching.empty_batch(16)], pad_id=PAD), online)


def test_filler_rows_carry_no_signal_and_shuffling_keeps_rows_whole():
    b = batching.pad_records([_record([1, 2], [3], advantage=float(i), source_id=i) for i in range(5)], PAD)
    padded = batching.pad_rows_to_multiple(b, 4)
    assert len(padded[Columns.INPUT_IDS]) == 8
    assert not padded[Columns.COMPLETION_MASK][5:].any() and not padded[Columns.ADVANTAGES][5:].any()
    assert batching.pad_rows_to_multiple(b, 5) is b
    shuffled = batching.shuffle_rows(b, np.random.default_rng(0))
    assert not np.array_equal(shuffled[Columns.SOURCE_ID], b[Columns.SOURCE_ID])
    np.testing.assert_array_equal(shuffled[Columns.ADVANTAGES], shuffled[Columns.SOURCE_ID].astype(np.float32))
    assert batching.to_multi_agent_batch(padded).env_steps() == 8


def test_group_advantages_are_z_scores_within_each_prompt_group():
    records = [{Record.REWARD: r, Record.GROUP_ID: g} for r, g in [(1.0, 7), (0.0, 7), (0.0, 7), (0.5, 8), (0.5, 8)]]
    batching.add_group_advantages(records)
    adv = [r[Record.ADVANTAGE] for r in records]
    std = np.std([1.0, 0.0, 0.0], ddof=1)
    np.testing.assert_allclose(adv, [(1 - 1 / 3) / std, -1 / 3 / std, -1 / 3 / std, 0.0, 0.0], rtol=1e-5)


def test_one_completion_through_its_shapes_episode_record_batch():
    ep = completion_episode(
        prompt_ids=[3, 4],
        completion_ids=[5, 6, 2],
        behavior_logprobs=[-0.5, -0.25, -0.125],
        reward=1.0,
        weights_seq_no=4,
        group_id=12,
        source_id=0,
        infos={"prompt": "(0"},
    )
    (record,) = episodes_to_records([ep])
    assert (record[Record.REWARD], record[Record.GROUP_ID], record[Record.WEIGHTS_SEQ_NO]) == (1.0, 12, 4)
    b = batching.pad_records([dict(record, advantage=1.0)], pad_id=PAD)
    np.testing.assert_array_equal(b[Columns.INPUT_IDS], [[3, 4, 5, 6, 2]])
    np.testing.assert_array_equal(b[Columns.BEHAVIOR_LOGPROBS], [[0.0, -0.5, -0.25, -0.125]])
    assert b[Columns.WEIGHTS_SEQ_NO][0] == 4


def test_offline_prelearner_rows_make_the_same_batch_as_records(tiny_model):
    """Trajectory rows through the prelearner (fixed width) and concat_padded = the same records padded directly."""
    config = SimpleNamespace(
        policy_model=tiny_model, trust_remote_code=False, offline_max_seq_len=24, offline_skip_bad_rows=False
    )
    prelearner = P3OOfflinePreLearner(config)
    rows = [
        {
            "prompt_ids": [3, 9, 13],
            "completion_ids": [8, 1],
            "behavior_logprobs": [-0.5, -0.1],
            "reward": 1.0,
            "advantage": 0.75,
            "group_id": "g",
            "policy_version": 2,
            "source": "policy",
        },
        {
            "prompt_ids": [3, 9],
            "completion_ids": [8, 1, 4],
            "behavior_logprobs": [-0.5, -0.1, -0.2],
            "reward": 0.0,
            "advantage": -0.75,
            "group_id": "g",
            "policy_version": 2,
            "source": "policy",
        },
    ]
    columns = {k: np.array([r[k] for r in rows] + [None], dtype=object)[:-1] for k in rows[0]}
    out = prelearner(columns)
    fixed = {k.split("/", 1)[1]: v for k, v in out.items()}
    assert fixed[Columns.INPUT_IDS].shape == (2, 24)
    replayed_policy = source_id("offline/policy")
    records = [
        _record(
            r["prompt_ids"], r["completion_ids"], advantage=r["advantage"], weights_seq_no=2, source_id=replayed_policy
        )
        for r in rows
    ]
    for rec, r in zip(records, rows):
        rec[Record.BEHAVIOR_LOGPROBS] = np.asarray(r["behavior_logprobs"], np.float32)
    _assert_batches_equal(
        batching.concat_padded([fixed], pad_id=prelearner.pad_id), batching.pad_records(records, prelearner.pad_id)
    )
