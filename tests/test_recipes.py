"""CONTRIBUTING's recipes, run as written: a new batch column is one declaration plus its producer, a new batch
source is a `BatchSource` plus an override of `P3O.batch_sources`, and a new environment is one module in
`rllib_p3o/envs/` with its test and a config line (the loss recipe runs in tests/test_losses.py)."""

from typing import Any, Dict, List, Optional

import numpy as np
import pytest

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.core import columns
from rllib_p3o.core.columns import Record
from rllib_p3o.data import batching
from rllib_p3o.data.episodes import Turn, completion_episode, episodes_to_records, multi_turn_episode
from rllib_p3o.data.recorder import records_to_table
from rllib_p3o.data.trajectories import row_to_record
from rllib_p3o.driver.batch_sources import BatchSource, SourceBatch

# -- adding a batch column -------------------------------------------------------------------------------------------

# The recipe's one declaration: a per-row column the learner (or a loss) reads, carried from the runner's episodes,
# recorded in the trajectory files and read back from them.
DIFFICULTY = columns.Field(
    "difficulty", columns.ROW, np.float32, batch="difficulty", default=0.0, episode=True, file="difficulty",
    arrow="float32",
)  # fmt: skip


def test_a_new_column_is_one_declaration_plus_its_producer(monkeypatch):
    monkeypatch.setattr(columns, "FIELDS", columns.FIELDS + (DIFFICULTY,))
    # Its producer: the runner passes the value with the episode it builds.
    single = completion_episode(
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        behavior_logprobs=[-0.5, -1.0],
        reward=1.0,
        weights_seq_no=3,
        group_id=0,
        extras={"difficulty": 0.5},
    )
    turns = [Turn([5], [-0.1], 0.0, [6, 7]), Turn([8], [-0.2], 1.0, [])]
    multi = multi_turn_episode(prompt_ids=[1], turns=turns, terminated=True, weights_seq_no=3, group_id=0)
    records = episodes_to_records([single, multi])  # the driver's side
    assert [r["difficulty"] for r in records] == [0.5, 0.0]  # the declared default where no producer set it
    for r in records:
        r[Record.ADVANTAGE] = 1.0
    # Padding, and the online and offline parts joined at one width.
    batch = batching.pad_records(records, pad_id=0)
    assert batch["difficulty"].dtype == np.float32 and batch["difficulty"].tolist() == [0.5, 0.0]
    joined = batching.concat_padded([batch, batching.pad_records(records[:1], pad_id=0, pad_to=9)], pad_id=0)
    assert joined["difficulty"].tolist() == [0.5, 0.0, 0.5]
    assert batching.empty_batch(4)["difficulty"].shape == (0,)
    # Recorded in the trajectory files, and read back from them as an offline row.
    table = records_to_table(records)
    assert table.schema.field("difficulty").type == "float" and table.column("difficulty").to_pylist() == [0.5, 0.0]
    back = [row_to_record(row, tokenizer=None) for row in table.to_pylist()]
    assert [r["difficulty"] for r in back] == [0.5, 0.0]
    assert back[0][Record.WEIGHTS_SEQ_NO] == 3  # the file's policy_version


# A per-token column: one value per completion token, given per turn in multi-turn episodes; the multi-turn decoder
# places it over the whole completion (its default on the environment's tokens: 0) without a line of its own.
TOKEN_WEIGHT = columns.Field(
    "token_weight", columns.TOKEN, np.float32, batch="token_weight", default=1.0, episode=True, file="token_weight",
    arrow="list<float32>",
)  # fmt: skip


def test_a_new_per_token_column_needs_no_line_in_the_multi_turn_decoder(monkeypatch):
    monkeypatch.setattr(columns, "FIELDS", columns.FIELDS + (TOKEN_WEIGHT,))
    single = completion_episode(
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        behavior_logprobs=[-0.5, -1.0],
        reward=1.0,
        weights_seq_no=3,
        group_id=0,
        extras={"token_weight": [0.5, 0.25]},
    )
    turns = [
        Turn([5, 6], [-0.1, -0.2], 0.0, [7, 8, 9], extras={"token_weight": [2.0, 3.0]}),
        Turn([10], [-0.3], 1.0, []),  # no value given: the declared default at its tokens
    ]
    multi = multi_turn_episode(prompt_ids=[1], turns=turns, terminated=True, weights_seq_no=3, group_id=0)
    records = episodes_to_records([single, multi])
    assert records[0]["token_weight"].tolist() == [0.5, 0.25]
    assert records[1][Record.COMPLETION_IDS].tolist() == [5, 6, 7, 8, 9, 10]
    assert records[1]["token_weight"].tolist() == [2.0, 3.0, 0.0, 0.0, 0.0, 1.0]
    assert records[1][Record.LOSS_MASK].tolist() == [1, 1, 0, 0, 0, 1]
    for r in records:
        r[Record.ADVANTAGE] = 1.0
    batch = batching.pad_records(records, pad_id=0)  # at the completion's target positions
    assert batch["token_weight"].dtype == np.float32
    assert batch["token_weight"].tolist() == [[0.0, 0.5, 0.25, 0.0, 0.0, 0.0], [2.0, 3.0, 0.0, 0.0, 0.0, 1.0]]
    table = records_to_table(records)
    back = [row_to_record(row, tokenizer=None) for row in table.to_pylist()]
    assert [r["token_weight"].tolist() for r in back] == [[0.5, 0.25], [2.0, 3.0, 0.0, 0.0, 0.0, 1.0]]


def test_the_built_in_fields_keep_the_batch_layout():
    assert columns.BATCH_COLUMNS == (
        "input_ids",
        "attention_mask",
        "completion_mask",
        "behavior_logprobs",
        "kept_ids",
        "policy_version",
        "advantages",
        "weights_seq_no",
        "source_id",
        "staleness",
    )
    assert columns.batch_layout(columns.FIELDS)[1:3] == (columns.TARGET_COLUMNS, columns.ROW_COLUMNS)


# -- adding a batch source -------------------------------------------------------------------------------------------


class ReplaySource(BatchSource):
    """Rows replayed, in order, from a fixed list of records; its position is checkpointed."""

    state_key = "replay_position"

    def __init__(self, records: List[Dict[str, Any]], rows_per_step: int, pad_id: int):
        self.records, self.rows_per_step, self.pad_id, self.position = records, rows_per_step, pad_id, 0
        self.sampled: List[int] = []  # which records each sample took (for the test)

    def sample(self, iteration: int, timings: Dict[str, float]) -> SourceBatch:
        taken = [(self.position + i) % len(self.records) for i in range(self.rows_per_step)]
        self.position += self.rows_per_step
        self.sampled.append(taken[0])
        rows = [{**self.records[i], Record.ADVANTAGE: 1.0} for i in taken]
        return SourceBatch(batching.pad_records(rows, self.pad_id), [])

    def get_state(self) -> Optional[Dict[str, int]]:
        return {"position": self.position}

    def set_state(self, state: Dict[str, int]) -> Dict[str, float]:
        self.position = int(state["position"])
        return {}


class P3OWithReplay(P3O):
    def batch_sources(self) -> List[BatchSource]:
        records = [
            {Record.PROMPT_IDS: [1, 2, 3], Record.COMPLETION_IDS: [4 + i % 5], Record.BEHAVIOR_LOGPROBS: [-1.0]}
            for i in range(10)
        ]
        return super().batch_sources() + [ReplaySource(records, rows_per_step=4, pad_id=self._pad_id)]


@pytest.mark.slow
def test_a_new_batch_source_trains_and_resumes_where_it_was(ray_session, tiny_model, tmp_path):
    from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

    task = ArithmeticTask()
    config = (
        P3OConfig(algo_class=P3OWithReplay)  # the recipe: the subclass, through the config's algo_class
        .environment(env_config={"dataset": task.train_rows()[:100], "reward_fn": arithmetic_reward})
        .training(model=tiny_model, group_size=4, prompts_per_step=2, max_tokens=2, lr=1e-3, eval_interval=0)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        replay = algo._sources[-1]
        assert isinstance(replay, ReplaySource) and replay.sampled == [0, 4]
        assert algo._run.rows_trained == 2 * (2 * 4 + 4)  # the online rows and the replayed ones
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = P3OWithReplay.from_checkpoint(path)
    try:
        restored.train()
        assert restored._sources[-1].sampled == [8]  # where the uninterrupted run would be
    finally:
        restored.stop()


# -- adding an environment ---------------------------------------------------------------------------------------------


def _environment_recipe() -> List[str]:
    """The code blocks of CONTRIBUTING.md's "Adding an environment": the adapter, its test, the config line."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "CONTRIBUTING.md")).read()
    section = text.split("## Adding an environment", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_environment_recipe_runs_as_written(tmp_path, monkeypatch, tiny_model):
    adapter, adapter_test, config_line = _environment_recipe()
    (tmp_path / "guess_digit.py").write_text(adapter)
    (tmp_path / "test_guess_digit.py").write_text(adapter_test.replace("rllib_p3o.envs.guess_digit", "guess_digit"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import guess_digit
    import test_guess_digit

    tests = [getattr(test_guess_digit, t) for t in dir(test_guess_digit) if t.startswith("test_")]
    assert tests
    for test in tests:
        test()
    # The config line, with the module where this test put it: a real config, validated (the class is importable,
    # its rows are prompt rows).
    config = P3OConfig().training(model=tiny_model, group_size=2, prompts_per_step=2, max_tokens=2)
    exec(
        config_line.replace("rllib_p3o.envs.guess_digit", "guess_digit"),
        {"config": config, "guess_digit_rows": guess_digit.guess_digit_rows},
    )
    config.validate()
    assert config.env_config["multi_turn_env"] == "guess_digit:GuessDigitEnv"
    assert {"prompt", "secret"} <= set(config.env_config["dataset"][0])
