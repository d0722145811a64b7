"""Plain helpers the tests import (``from helpers import tiny_config``); the fixtures are in `conftest.py`."""

from rllib_p3o import P3OConfig
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward


def tiny_config(
    model: str,
    reward_fn=arithmetic_reward,
    *,
    rows: int = 64,
    eval_rows: int = 0,
    num_env_runners: int = 1,
    seed: int = 0,
    **training,
) -> P3OConfig:
    """The tests' tiny online P3O run on the arithmetic task: its first ``rows`` training prompts, groups of 4, 8 prompts
    per step, 2 new tokens, lr 1e-3, ``num_env_runners`` vLLM runners, ``seed``. With ``eval_rows``, the first that
    many held-out prompts, evaluated every iteration (the default interval); without, evaluation is off.
    ``training``: more `.training()` settings, or other values for these.

    A reward function written for one test belongs inside that test: cloudpickle ships a local function to the
    runners by value, while one of a test module is pickled by reference to a module the runners cannot import.
    """
    task = ArithmeticTask()
    env_config = {"dataset": task.train_rows()[:rows], "reward_fn": reward_fn}
    settings = dict(group_size=4, prompts_per_step=8, max_tokens=2, lr=1e-3)
    if eval_rows:
        env_config["eval_dataset"] = task.heldout_rows()[:eval_rows]
    else:
        settings["eval_interval"] = 0
    return (
        P3OConfig()
        .environment(env_config=env_config)
        .training(model=model, **{**settings, **training})
        .env_runners(num_env_runners=num_env_runners)
        .debugging(seed=seed)
    )
