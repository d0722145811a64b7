"""Plain helpers the tests import (``from helpers import tiny_config``); the fixtures are in `conftest.py`."""

import os
import shutil
from pathlib import Path

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


# The base model ``make demo`` builds, which the getting-started script reuses when it was built the same way.
MAKE_DEMO_BASE_MODEL = Path(__file__).resolve().parents[1] / "runs" / "demo" / "base_model"
_BUILT = "pretrain_args.json"  # written last by ``build_demo_model``


def copy_demo_base_model(kept: Path, workdir: Path) -> None:
    """Copy a built demo base model into ``workdir/base_model``, where the getting-started script looks: the one the
    session kept (``kept``, the `demo_base_model` fixture), else the one ``make demo`` built, else none (the script
    builds it)."""
    for built in (kept, MAKE_DEMO_BASE_MODEL):
        if os.path.exists(os.path.join(built, _BUILT)):
            shutil.copytree(built, workdir / "base_model")
            return


def keep_demo_base_model(workdir: Path, kept: Path) -> None:
    """Keep the base model a script built in ``workdir`` for the session's next test (`copy_demo_base_model`)."""
    if not os.path.exists(os.path.join(kept, _BUILT)) and os.path.exists(workdir / "base_model" / _BUILT):
        shutil.copytree(workdir / "base_model", kept, dirs_exist_ok=True)
