"""TextEnv, prompt datasets (Parquet/JSONL/list) and the reward-function contract, with their error messages."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_p3o.data.datasets import DatasetError, load_prompt_dataset
from rllib_p3o.data.rewards import RewardFunctionError
from rllib_p3o.runner.env import TextEnv
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

ROWS = [{"prompt": "(01+02)%10=", "answer": "3"}, {"prompt": "(05+09)%10=", "answer": "4"}]


def test_dataset_formats_agree(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    for spec in (ROWS, tmp_path / "d.parquet", str(tmp_path / "d.jsonl"), str(tmp_path / "d.json")):
        assert load_prompt_dataset(spec) == ROWS


@pytest.mark.parametrize(
    "content, message",
    [
        ([], "empty"),
        ([{"question": "x"}], "row 0 has no 'prompt' column"),
        ([{"prompt": "a"}, {"prompt": 3}], "row 1 column 'prompt' must be a non-empty string"),
    ],
)
def test_bad_datasets_are_named(content, message):
    with pytest.raises(DatasetError, match=message):
        load_prompt_dataset(content)


def test_bad_files_are_named(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        load_prompt_dataset(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl line 2"):
        load_prompt_dataset(bad)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 definitely not parquet")
    with pytest.raises(DatasetError, match="broken.parquet"):
        load_prompt_dataset(broken)


def test_env_episode_is_one_step_with_verifier_reward():
    env = TextEnv({"dataset": ROWS, "reward_fn": arithmetic_reward, "seed": 1})
    prompt, info = env.reset()
    assert prompt in {r["prompt"] for r in ROWS}
    _, reward, terminated, truncated, _ = env.step(info["row"]["answer"] + "<junk>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.reset()
    assert env.step("nope")[1] == 0.0
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("x")


def test_every_runner_holds_every_row_and_the_gym_order_is_one_epoch():
    rows = [{"prompt": f"p{i}"} for i in range(10)]
    # The driver's schedule picks the rows (tests/test_prompt_schedule.py): no runner may hold only a shard.
    for i in (1, 2, 3):
        env = TextEnv({"dataset": rows, "reward_fn": arithmetic_reward, "worker_index": i, "num_workers": 3})
        assert [r["prompt"] for r in env.rows] == [r["prompt"] for r in rows]
    env = TextEnv({"dataset": rows, "reward_fn": arithmetic_reward})
    assert sorted(r["prompt"] for r in env.next_rows(10)) == sorted(r["prompt"] for r in rows)  # one epoch


def _raises(prompts, completions, **kw):
    raise KeyError("answer_column")


@pytest.mark.parametrize(
    "fn, message",
    [
        (_raises, r"reward function _raises raised KeyError.*first prompt '\(01\+02\)%10='"),
        (lambda p, c, **kw: [1.0], r"returned 1 rewards for 2 completions"),
        (lambda p, c, **kw: [1.0, math.nan], r"returned nan for prompt '\(05\+09\)%10=' and completion 'b'"),
        (lambda p, c, **kw: None, r"must return a list of floats"),
    ],
)
def test_reward_function_errors_name_function_and_prompt(fn, message):
    env = TextEnv({"dataset": ROWS, "reward_fn": fn})
    with pytest.raises(RewardFunctionError, match=message):
        env.score([r["prompt"] for r in ROWS], ["a", "b"], ROWS)


def test_reward_fn_by_name_and_trl_signature():
    env = TextEnv({"dataset": ROWS, "reward_fn": "rllib_p3o.tasks.arithmetic:arithmetic_reward"})
    assert list(env.score([r["prompt"] for r in ROWS], ["3", " 4x"], ROWS)) == [1.0, 1.0]


def test_arithmetic_task_split_is_honest():
    task = ArithmeticTask()
    train, held = task.train_rows(), task.heldout_rows()
    assert len(held) == 200 and len(train) == 10_000 - 200
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["answer"] for r in held}) == 10  # answers depend on the prompt
    assert arithmetic_reward(["(37+45)%10="], ["2"], answer=["2"]) == [1.0]
