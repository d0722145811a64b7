"""Built-in rewards users bring from other stacks: math-verify's answer checker and reasoning-gym's tasks with their
verifiers (the real packages), and a few iterations of P3O on a reasoning-gym task (real Ray, RLlib, vLLM)."""

import threading

import pytest

from rllib_p3o.data.math_rewards import math_verify_reward
from rllib_p3o.data.rewards import RewardFunction


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
    fn = RewardFunction("rllib_p3o.data.math_rewards:math_verify_reward")
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=fn.score(["1+1=", "2+2="], ["2", "5"], rows)))
    thread.start()
    thread.join()
    assert out["r"].total.tolist() == [1.0, 0.0] and fn.names == ["math_verify_reward"]
    with pytest.raises(ValueError, match="'solution' .* or 'answer' column"):
        math_verify_reward(["2"])
