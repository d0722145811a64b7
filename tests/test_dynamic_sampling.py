"""DAPO's sampling recipes: the overlong penalty and dynamic sampling, as pure functions and in real training (Ray,
RLlib, vLLM), and exact resume with dynamic sampling: a restored run samples the uninterrupted run's next batch."""

import math
import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from ray import cloudpickle

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.columns import Record
from rllib_p3o.data.sampling_recipes import (
    apply_overlong_shaping,
    group_has_signal,
    longest_model_turn,
    overlong_penalty,
    split_by_signal,
    truncated_share,
)

# The runner actor cannot import this test module: ship its reward function by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _record(group, reward, length, mask=None):
    r = {Record.GROUP_ID: group, Record.REWARD: reward, Record.COMPLETION_IDS: np.zeros(length, dtype=np.int64)}
    if mask is not None:
        r[Record.LOSS_MASK] = np.asarray(mask, dtype=np.int8)
    return r


def test_overlong_penalty_is_dapo_s_linear_buffer():
    # L_max = 20, buffer 4: no penalty up to 16 tokens, then -1/4 per token, -1 at 20.
    assert [overlong_penalty(n, 20, 4) for n in (10, 16, 17, 18, 20)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(20, 20, 0) == 0.0  # buffer 0: off
    # A multi-turn episode is charged for its longest model turn (runs of loss mask 1), not its environment tokens.
    episode = _record(0, 1.0, 9, mask=[1, 1, 0, 0, 0, 1, 1, 1, 0])
    assert longest_model_turn(episode) == 3 and longest_model_turn(_record(0, 1.0, 5)) == 5
    records = [_record(0, 1.0, 4), _record(0, 0.0, 3), _record(1, float("nan"), 4), episode]
    share, mean_added = apply_overlong_shaping(records, max_tokens=4, buffer=2, penalty=0.5)
    assert [r[Record.REWARD] for r in records[:2]] == [0.5, -0.25] and math.isnan(records[2][Record.REWARD])
    assert records[3][Record.REWARD] == 0.75  # its longest turn, 3 tokens
    assert share == 0.5 == truncated_share(records, 4) and mean_added == pytest.approx((-0.5 - 0.25 - 0.5 - 0.25) / 4)


def test_groups_whose_rewards_are_all_equal_are_left_out():
    nan = float("nan")
    assert not group_has_signal([1.0, 1.0]) and not group_has_signal([0.0, nan]) and group_has_signal([0.0, nan, 1])
    records = [_record(g, r, 1) for g, r in [(5, 0.0), (5, 0.0), (6, 0.0), (6, 1.0), (7, nan), (7, nan)]]
    kept, filtered = split_by_signal(records)
    assert [r[Record.GROUP_ID] for r in kept] == [6, 6] and [r[Record.GROUP_ID] for r in filtered] == [5, 5, 7, 7]


def starts_with_one(prompts, completions, **_):
    """Rarely right for a random tiny model, so that many groups have no signal."""
    return [1.0 if c.strip().startswith("1") else 0.0 for c in completions]


def _batch(algo, iteration):
    table = pq.read_table(os.path.join(algo.logdir, "completions", f"iter_{iteration:06d}.parquet")).to_pylist()
    return sorted((r["group_id"], r["prompt"], r["completion"], round(r["reward"], 6)) for r in table)


def test_resume_with_dynamic_sampling_samples_the_uninterrupted_run_s_next_batch(ray_session, tiny_model, tmp_path):
    from rllib_p3o.tasks import ArithmeticTask

    config = (
        P3OConfig()
        .environment(env_config={"dataset": ArithmeticTask().train_rows()[:64], "reward_fn": starts_with_one})
        .training(
            model=tiny_model,
            group_size=4,
            prompts_per_step=2,
            max_tokens=3,
            dynamic_sampling=True,
            dynamic_sampling_max_rounds=3,
            overlong_buffer=1,
            overlong_penalty=0.1,
            log_completions=1000,  # every completion of the step
        )
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        first = algo.train()
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
        second = algo.train()
        uninterrupted = _batch(algo, 2)
    finally:
        algo.stop()
    for result in (first, second):
        p3o = result[m.P3O]
        assert p3o[m.NUM_COMPLETIONS] == 8  # the step keeps its size, filled if need be
        assert 0 <= p3o[m.EXTRA_SAMPLING_ROUNDS] <= 3 and 0.0 <= p3o[m.TRUNCATED_SHARE] <= 1.0
        assert -0.1 <= p3o[m.OVERLONG_PENALTY_MEAN] <= 0.0
    # The random model rarely starts with a 1: groups without signal were left out and more were sampled.
    assert first[m.P3O][m.GROUPS_FILTERED] + second[m.P3O][m.GROUPS_FILTERED] > 0
    assert first[m.P3O][m.EXTRA_SAMPLING_ROUNDS] + second[m.P3O][m.EXTRA_SAMPLING_ROUNDS] > 0
    assert (
        second[m.P3O][m.GROUPS_FILTERED_LIFETIME] == first[m.P3O][m.GROUPS_FILTERED] + second[m.P3O][m.GROUPS_FILTERED]
    )
    # The groups left out were drawn: the next step's groups come after them in the schedule.
    assert min(g for g, *_ in uninterrupted) >= 2

    restored = P3O.from_checkpoint(checkpoint)
    try:
        result = restored.train()
        resumed = _batch(restored, 2)
    finally:
        restored.stop()
    assert result["training_iteration"] == 2
    assert resumed == uninterrupted  # same groups, prompts, completions and (shaped) rewards
    for key in (m.GROUPS_FILTERED, m.EXTRA_SAMPLING_ROUNDS, m.GROUPS_FILTERED_LIFETIME, m.TRUNCATED_SHARE):
        assert result[m.P3O][key] == second[m.P3O][key]
