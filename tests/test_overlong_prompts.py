"""Prompts longer than the model's context minus max_tokens (`rllib_p3o.data.prompt_fit`): named before any engine
starts, or dropped / cut from the left with a metric, the same rows on every runner. The pure function first; then a
real run (Ray, RLlib, vLLM, the tiny model with 128 positions) with one row of about 300 tokens."""

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.data.prompt_fit import PROMPT_IDS, OverlongPromptError, fit_prompts, row_prompt_ids
from rllib_p3o.tasks import ArithmeticTask


def _encode(prompt):
    return list(range(len(prompt.split())))  # a token per word


def test_fit_prompts_errors_drops_or_cuts_the_rows_that_do_not_fit():
    rows = [{"prompt": "a b c"}, {"prompt": " ".join("x" * 12)}, {"prompt": "d e"}]
    with pytest.raises(
        OverlongPromptError,
        match=r"train.jsonl: row 1: the prompt is 12 tokens .* context of 16 "
        r"minus max_tokens=6 = 10\. .*overlong_prompts='drop'.*'truncate_left'",
    ):
        fit_prompts(rows, _encode, 16, 6, "error", "train.jsonl")
    dropped = fit_prompts(rows, _encode, 16, 6, "drop", "train.jsonl")
    assert [r["prompt"] for r in dropped.rows] == ["a b c", "d e"] and dropped.dropped == 1
    cut = fit_prompts(rows, _encode, 16, 6, "truncate_left", "train.jsonl")
    assert cut.truncated == 1 and cut.rows[1][PROMPT_IDS] == list(range(2, 12))  # the last 10 tokens
    assert row_prompt_ids(cut.rows[1], _encode) == list(range(2, 12)) and row_prompt_ids(rows[0], _encode) == [0, 1, 2]
    with pytest.raises(OverlongPromptError, match="max_tokens=16 leaves no room"):
        fit_prompts(rows, _encode, 16, 16, "drop", "train.jsonl")
    with pytest.raises(OverlongPromptError, match="every one of its 1 prompts"):
        fit_prompts(rows[1:2], _encode, 16, 6, "drop", "train.jsonl")


def _config(model, tmp_path, **training):
    rows = ArithmeticTask().train_rows()[:16]
    rows[5] = dict(rows[5], prompt=" ".join(["1 + 2 ="] * 75))  # ~300 tokens for a model with 128 positions
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    return (
        P3OConfig()
        .environment(env_config={"dataset": str(path), "reward_fn": "rllib_p3o.tasks.arithmetic:arithmetic_reward"})
        .training(model=model, group_size=2, prompts_per_step=4, eval_interval=0, **{"max_tokens": 4, **training})
        .env_runners(num_env_runners=0)
        .debugging(seed=0)
    )


def test_an_overlong_row_is_named_before_any_engine_starts(tiny_model, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"dataset .*train.jsonl: row 5: the prompt is \d{3} tokens \(chat template "
        r"applied\), longer than the model's context of 128 minus max_tokens=4 = 124",
    ):
        _config(tiny_model, tmp_path).validate()
    with pytest.raises(ValueError, match="max_tokens=128 leaves no room for a prompt"):
        _config(tiny_model, tmp_path, max_tokens=128, overlong_prompts="drop").validate()


@pytest.mark.parametrize("policy, key", [("drop", m.PROMPTS_DROPPED), ("truncate_left", m.PROMPTS_TRUNCATED)])
def test_dropped_or_cut_rows_train_and_are_counted(ray_session, tiny_model, tmp_path, policy, key):
    algo = _config(tiny_model, tmp_path, overlong_prompts=policy).build_algo()
    try:
        result = algo.train()
        assert result[m.P3O][key] == 1.0
        assert algo.env_runner.num_prompts() == (15 if policy == "drop" else 16)
    finally:
        algo.stop()
