"""Built-in rewards users bring from other stacks: math-verify's answer checker and reasoning-gym's tasks with their
verifiers (the real packages), and a few iterations of P3O on a reasoning-gym task (real Ray, RLlib, vLLM)."""

import math
import os
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.data.rewards import RewardFunction
from rllib_p3o.envs.math_rewards import math_verify_reward
from rllib_p3o.envs.reasoning_gym_tasks import (
    INDEX_COLUMN,
    TASK_COLUMN,
    reasoning_gym_dataset,
    reasoning_gym_reward,
)


def test_math_verify_reward_checks_equal_answers_in_any_notation():
    completions = ["The answer is $\\boxed{\\frac{2}{4}}$", "0.5", "It is 3.", "no number", "42"]
    solution = ["\\frac{1}{2}", "$\\frac{1}{2}$", "4", "4", "not a formula at all"]
    assert math_verify_reward(completions, solution=solution) == [1.0, 1.0, 0.0, 0.0, None]
    # TRL's conversational completions and the `answer` column (this package's demo convention) work the same.
    messages = [[{"role": "assistant", "content": "so $x = 7$"}], [{"role": "assistant", "content": "8"}]]
    assert math_verify_reward(messages, answer=["7", "7"]) == [1.0, 0.0]


def test_math_verify_reward_through_the_reward_contract_and_off_the_main_thread():
    """Through `RewardFunction` as the runners call it; math-verify's SIGALRM timeouts only work on the main thread,
    so elsewhere the reward runs without them instead of raising."""
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    fn = RewardFunction("rllib_p3o.envs.math_rewards:math_verify_reward")
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=fn.score(["1+1=", "2+2="], ["2", "5"], rows)))
    thread.start()
    thread.join()
    assert out["r"].total.tolist() == [1.0, 0.0] and fn.names == ["math_verify_reward"]
    with pytest.raises(ValueError, match="'solution' .* or 'answer' column"):
        math_verify_reward(["2"])


def test_reasoning_gym_rows_are_scored_by_the_task_s_verifier():
    rows = reasoning_gym_dataset("basic_arithmetic", size=6, seed=3, max_terms=3)
    assert rows == reasoning_gym_dataset("basic_arithmetic", size=6, seed=3, max_terms=3)  # procedural, seeded
    assert rows[0]["prompt"][0]["role"] == "system" and "<answer>" in rows[0]["prompt"][0]["content"]
    assert rows[0]["prompt"][1]["content"].startswith("Calculate")
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    right = [[{"role": "assistant", "content": f"steps... <answer>{r['answer']}</answer>"}] for r in rows]
    assert reasoning_gym_reward(right, **columns) == [1.0] * 6
    assert reasoning_gym_reward([r["answer"] for r in rows], **columns) == [1.0] * 6  # untagged: the whole text
    assert reasoning_gym_reward(["<answer>x</answer>"] * 6, **columns) == [0.0] * 6
    # Rows made by another reasoning-gym version (another answer for the same entry) fail, naming the entry.
    columns["answer"] = ["999999"] + columns["answer"][1:]
    with pytest.raises(ValueError, match=r"entry 0: the row's answer '999999' is not the regenerated"):
        reasoning_gym_reward(right, **columns)
    with pytest.raises(ValueError, match="cannot create task 'basic_arithmetic'.*unexpected keyword"):
        reasoning_gym_dataset("basic_arithmetic", size=2, max_terns=3)
    plain = reasoning_gym_dataset("chain_sum", size=2, chat=False)
    assert isinstance(plain[0]["prompt"], str) and plain[0][TASK_COLUMN] and plain[1][INDEX_COLUMN] == 1


def test_p3o_trains_on_a_reasoning_gym_task_scored_by_its_verifier_and_math_verify(ray_session, tmp_path):
    """Two iterations of P3O on reasoning-gym's chain_sum (string prompts for a tiny model without a chat template),
    scored by the task's verifier and by math-verify; the sample completions' rewards are recomputed here."""
    from rllib_p3o.tasks import build_tiny_model

    rows = reasoning_gym_dataset("chain_sum", size=16, seed=0, chat=False, min_terms=2, max_terms=2, max_digits=1)
    corpus = [r["prompt"] + " " + r["answer"] for r in rows] * 20
    model = build_tiny_model(str(tmp_path / "tiny_rg"), corpus, vocab_size=80)
    config = (
        P3OConfig()
        .environment(env_config={"dataset": rows, "reward_fn": [reasoning_gym_reward, math_verify_reward]})
        .training(model=model, group_size=4, prompts_per_step=4, max_tokens=3, log_completions=16)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for result in results:
        p3o = result[m.P3O]
        assert set(p3o[m.REWARDS]) == {"reasoning_gym_reward", "math_verify_reward"}
        assert np.isfinite(p3o[m.REWARD_MEAN]) and p3o[m.TRAINED_TOKENS] > 0
    by_prompt = {r["prompt"]: r for r in rows}
    table = pq.read_table(os.path.join(algo.logdir, "completions", "iter_000002.parquet")).to_pylist()
    assert len(table) == 16
    for sample in table:  # what the runner scored is what the verifiers say about the same text
        row = by_prompt[sample["prompt"]]
        columns = {k: [v] for k, v in row.items() if k != "prompt"}
        expected_rg = reasoning_gym_reward([sample["completion"]], **columns)[0]
        expected_mv = math_verify_reward([sample["completion"]], answer=[row["answer"]])[0]
        assert sample["rewards/reasoning_gym_reward"] == pytest.approx(expected_rg)
        assert (expected_mv is None and math.isnan(sample["rewards/math_verify_reward"])) or sample[
            "rewards/math_verify_reward"
        ] == pytest.approx(expected_mv)
