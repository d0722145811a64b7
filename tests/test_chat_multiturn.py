"""Conversational prompts, multi-turn episodes and tools without an engine: chat rendering on a real tokenizer with a
chat template, episode → record → batch with the loss mask, the ESS over model tokens only, tool errors and
timeouts, and multi-turn rows through Parquet and the validator (real pyarrow)."""

import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from rllib_p3o.core.batch_stats import effective_sample_size_from_log_ratios
from rllib_p3o.core.columns import Columns, Record
from rllib_p3o.data import chat
from rllib_p3o.data.batching import add_group_advantages, pad_records
from rllib_p3o.data.datasets import DatasetError, load_prompt_dataset
from rllib_p3o.data.episodes import Turn, episodes_to_records, multi_turn_episode
from rllib_p3o.data.recorder import records_to_table
from rllib_p3o.data.rewards import RewardFunction
from rllib_p3o.data.trajectories import row_to_record, validate_trajectories
from rllib_p3o.runner.multiturn import ToolEnv, parse_tool_call, run_tool

MESSAGES = [{"role": "system", "content": "add"}, {"role": "user", "content": "(12+34)%10="}]


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_chat_model):
    return AutoTokenizer.from_pretrained(tiny_chat_model)


def test_conversational_prompt_is_rendered_by_the_chat_template(chat_tokenizer, tiny_model):
    ids = chat.prompt_token_ids(chat_tokenizer, MESSAGES)
    assert ids == chat_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    tokens = chat_tokenizer.convert_ids_to_tokens(ids)
    assert (
        tokens[0] == "<|im_start|>" and tokens.count("<|im_end|>") == 2 and tokens[-2:] == ["<|im_start|>", "assistant"]
    )
    with pytest.raises(chat.ChatTemplateError, match="tiny-plain"):
        chat.check_chat_template(AutoTokenizer.from_pretrained(tiny_model), "tiny-plain")


def test_env_turn_ids_append_the_template_continuation_without_re_rendering_the_history(chat_tokenizer):
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool = [{"role": "tool", "content": "46"}]
    ids = chat.env_turn_ids(chat_tokenizer, tool, after_token=im_end)
    # history (prompt + a model turn ending in <|im_end|>) + env turn == the template's rendering of all of it
    model_turn = chat_tokenizer("6", add_special_tokens=False)["input_ids"] + [im_end]
    history = chat.prompt_token_ids(chat_tokenizer, MESSAGES) + model_turn
    full = chat_tokenizer.apply_chat_template(
        MESSAGES + [{"role": "assistant", "content": "6"}] + tool, add_generation_prompt=True, return_dict=False
    )
    assert history + ids == full


def test_dataset_rows_may_be_chat_messages_and_bad_messages_name_the_row():
    rows = load_prompt_dataset([{"prompt": "1+1="}, {"prompt": MESSAGES}])
    assert chat.is_conversational(rows[1]["prompt"])
    with pytest.raises(DatasetError, match=r"row 1 column 'prompt': message 0"):
        load_prompt_dataset([{"prompt": "x"}, {"prompt": [{"role": "robot", "content": "hi"}]}])


def test_reward_function_gets_conversational_completions_as_messages():
    seen = {}

    def reward(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, keys=set(kwargs))
        return [1.0] * len(completions)

    RewardFunction(reward)([MESSAGES], ["6"], [{"prompt": MESSAGES}])
    assert seen["prompts"] == [MESSAGES]
    assert seen["completions"] == [[{"role": "assistant", "content": "6"}]]  # TRL's convention
    assert "completion_messages" not in seen["keys"]  # the old name of the same messages is gone
    RewardFunction(reward)(["1+1="], ["2"], [{"prompt": "1+1="}])
    assert seen["completions"] == ["2"]  # string rows: the text


def _episode(reward=1.0, group=0):
    return multi_turn_episode(
        prompt_ids=[5, 6, 7],
        turns=[
            Turn(action_ids=[10, 11], behavior_logprobs=[-0.1, -0.2], reward=0.0, env_ids=[12, 13, 14]),
            Turn(action_ids=[15], behavior_logprobs=[-0.3], reward=reward, env_ids=[]),
        ],
        terminated=True,
        weights_seq_no=3,
        group_id=group,
        source_id=0,
        infos={"turns": 2},
    )


def test_multi_turn_episode_becomes_one_record_with_a_loss_mask_on_model_tokens():
    ep = _episode()
    assert len(ep) == 2 and ep.is_terminated
    (r,) = episodes_to_records([ep])
    np.testing.assert_array_equal(r[Record.COMPLETION_IDS], [10, 11, 12, 13, 14, 15])
    np.testing.assert_array_equal(r[Record.LOSS_MASK], [1, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(r[Record.BEHAVIOR_LOGPROBS], [-0.1, -0.2, 0, 0, 0, -0.3], rtol=1e-6)
    assert r[Record.REWARD] == 1.0  # the episode return
    r[Record.ADVANTAGE] = 1.0
    batch = pad_records([r], pad_id=0)
    # targets: completion token j sits at P - 1 + j (P = 3)
    np.testing.assert_array_equal(batch[Columns.COMPLETION_MASK][0], [0, 0, 1, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(batch[Columns.INPUT_IDS][0], [5, 6, 7, 10, 11, 12, 13, 14, 15])


def test_ess_ignores_environment_tokens():
    r = episodes_to_records([_episode()])[0]
    r[Record.ADVANTAGE] = 1.0
    batch = pad_records([r], pad_id=0)
    mask = torch.as_tensor(batch[Columns.COMPLETION_MASK])
    log_ratios = torch.zeros_like(mask)
    log_ratios[0, 2:4] = torch.tensor([0.3, -0.2])
    log_ratios[0, 7] = 0.1
    with_env_noise = log_ratios.clone()
    with_env_noise[0, 4:7] = 25.0  # environment tokens: any value, they are context
    ess = effective_sample_size_from_log_ratios(log_ratios, mask, all_reduce=False)
    assert float(ess) < 1.0
    assert float(effective_sample_size_from_log_ratios(with_env_noise, mask, all_reduce=False)) == float(ess)


def test_group_advantages_use_episode_returns():
    records = episodes_to_records([_episode(1.0), _episode(0.0)])
    add_group_advantages(records)
    assert records[0][Record.ADVANTAGE] > 0 > records[1][Record.ADVANTAGE]


def test_tool_calls_parse_and_errors_become_messages(processes):
    assert parse_tool_call('<tool_call>{"name": "calc", "arguments": {"x": "1"}}</tool_call>') == ("calc", {"x": "1"})
    assert parse_tool_call("<tool_call>calc 12*34") == ("calc", "12*34")  # closing tag was the stop token
    assert parse_tool_call("<tool_call>calc(12*34)</tool_call>") == ("calc", "12*34")
    assert parse_tool_call("46") is None

    def boom(arg):
        raise ZeroDivisionError("division by zero")

    def slow(arg):
        time.sleep(5)

    tools = {"boom": boom, "slow": slow, "calc": lambda e: eval(e, {})}
    assert run_tool(tools, "calc", "12*34", timeout_s=1) == ("408", True)
    text, ok = run_tool(tools, "boom", "1", timeout_s=1)
    assert not ok and "ZeroDivisionError" in text
    t0 = time.perf_counter()
    text, ok = run_tool(tools, "slow", "1", timeout_s=0.2)
    assert not ok and "timed out" in text and time.perf_counter() - t0 < 2
    text, ok = run_tool(tools, "nope", "1", timeout_s=1)
    assert not ok and "unknown tool" in text


def test_tool_env_runs_calls_and_scores_the_final_answer(processes):
    env = ToolEnv(
        {
            "tools": {"calc": lambda e: eval(e, {}), "boom": lambda e: 1 / 0},
            "reward_fn": lambda prompts, completions, answer, **_: [
                float(c.strip() == a) for c, a in zip(completions, answer)
            ],
        }
    )
    env.reset({"prompt": "12*34=", "answer": "408"})
    r = env.step({"role": "assistant", "content": "<tool_call>calc 12*34"})
    assert r.messages == [{"role": "tool", "content": "408"}] and not r.terminated
    r = env.step({"role": "assistant", "content": "<tool_call>boom 1"})
    assert "ZeroDivisionError" in r.messages[0]["content"] and not r.terminated
    r = env.step({"role": "assistant", "content": "408"})
    assert r.terminated and r.reward == 1.0
    assert env.metrics() == {"tool_calls": 2.0, "tool_errors": 1.0}
    assert env.render_text([{"role": "tool", "content": "408"}]) == "<tool_response>408</tool_response>"


def test_multi_turn_rows_round_trip_through_parquet_and_the_validator(tmp_path, tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    records = episodes_to_records([_episode(1.0), _episode(0.0)])
    add_group_advantages(records)
    path = tmp_path / "part-0.parquet"
    pq.write_table(records_to_table(records), path)
    report = validate_trajectories(str(path), tokenizer=tok)
    assert report.ok, report.summary()
    back = row_to_record(pq.read_table(path).to_pylist()[0], tok)
    np.testing.assert_array_equal(back[Record.LOSS_MASK], records[0][Record.LOSS_MASK])
    np.testing.assert_array_equal(back[Record.COMPLETION_IDS], records[0][Record.COMPLETION_IDS])

    table = pq.read_table(path).to_pylist()
    table[1]["loss_mask"] = [1, 0]  # misaligned with its 6 completion tokens
    table[0]["loss_mask"] = [0] * 6
    bad = tmp_path / "bad.parquet"
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(path)), bad)
    problems = [str(p) for p in validate_trajectories(str(bad), tokenizer=tok).problems]
    assert any("row 1 column 'loss_mask': has 2 entries for 6 completion tokens" in p for p in problems), problems
    assert any("row 0 column 'loss_mask': has no model token" in p for p in problems), problems


def test_conversational_offline_rows_are_rendered_with_the_template(tmp_path, chat_tokenizer):
    import pyarrow as pa

    row = {
        "prompt": MESSAGES,
        "completion_ids": [5, 6],
        "reward": 1.0,
        "behavior_logprobs": [-0.5, -0.5],
        "group_id": "a",
    }
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    assert validate_trajectories(str(path), tokenizer=chat_tokenizer).ok
    rec = row_to_record(pq.read_table(path).to_pylist()[0], chat_tokenizer)
    assert list(rec[Record.PROMPT_IDS]) == chat.prompt_token_ids(chat_tokenizer, MESSAGES)


def test_product_task_tool_and_corpus_keep_the_held_out_pairs_out():
    from rllib_p3o.tasks.products import ProductTask, calc, tool_line

    assert calc("47*86") == "4042" and calc(" 12 + 30 ") == "42"
    with pytest.raises(ValueError, match="expected"):
        calc("__import__('os')")
    assert tool_line(47, "*", 86) == "47*86=<tool_call>calc(47*86)</tool_call><tool_response>4042</tool_response>4042"
    task = ProductTask()
    heldout = {r["prompt"] for r in task.heldout_rows()}
    assert len(heldout) == 200 and not heldout & {r["prompt"] for r in task.train_rows()}
    corpus = task.pretraining_corpus()
    assert not any(line.startswith(p) for line in corpus if "*" in line for p in heldout)
    with_tool = sum("*" in line and "<tool_call>" in line for line in corpus)
    assert 0.02 < with_tool / len(task.train_rows()) < 0.08  # products mostly answered directly
