"""Named runs that the tests, the benchmarks and the examples share, each one configuration factory: a change to one
of them is one edit, and what a test checks is the run a benchmark measures.

- `tiny_run`: the tiny online run on the arithmetic task (seconds per iteration on 2 cores): what the fault, restore
  and mistake tests kill, fail and continue, and what `benchmarks/faults.py` measures. Variants are arguments, never
  copies: a Tune script's 40 rows and 4 prompts per step, a soak's held-out evaluation and behavior model.
- `async_demo_run`: the demo (`rllib_p3o.tasks.demo_config`) with async sampling, as `examples/async.py` runs it.
- The demo and the claims bench's tasks are `rllib_p3o.tasks.demo_config` and `rllib_p3o.tasks.bench_config` (both
  over `rllib_p3o.tasks.task_config`); the getting-started script and the README's quick start are the docs' own code,
  run as written by the tests.

Every factory returns a `P3OConfig`; what a run records (its trajectory files, checkpoints, result rows) is named by its
arguments (``record_rollouts``) or by the Tune run around it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.arithmetic import ArithmeticTask, arithmetic_reward
from rllib_p3o.tasks.demo_config import demo_config

# The reward by import path: a Tune trial's saved config names it instead of pickling it.
ARITHMETIC_REWARD = "rllib_p3o.tasks.arithmetic:arithmetic_reward"


def tiny_run(
    model: str,
    reward_fn: Union[str, Callable[..., Any]] = arithmetic_reward,
    *,
    rows: Optional[int] = 64,
    eval_rows: Optional[int] = 0,
    num_env_runners: int = 1,
    seed: int = 0,
    **training: Any,
) -> P3OConfig:
    """The tiny online P3O run on the arithmetic task: its first ``rows`` training prompts (None: all), groups of 4,
    8 prompts per step, 2 new tokens, lr 1e-3, ``num_env_runners`` vLLM runners, a local learner, ``seed``. With
    ``eval_rows`` the first that many held-out prompts (None: all) are evaluated every ``eval_interval`` iterations;
    with 0, evaluation is off. ``training``: more `.training()` settings, or other values for these.

    A reward function written for one test belongs inside that test: cloudpickle ships a local function to the
    runners by value, while one of a test module is pickled by reference to a module the runners cannot import."""
    task = ArithmeticTask()
    env_config = {"dataset": task.train_rows()[:rows], "reward_fn": reward_fn}
    settings: dict = dict(group_size=4, prompts_per_step=8, max_tokens=2, lr=1e-3)
    if eval_rows != 0:
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


def async_demo_run(model: str, max_staleness: int = 2, **training: Any) -> P3OConfig:
    """The demo's run with async sampling: the runner keeps generating while the learner updates, samples up to
    ``max_staleness`` weight versions old (`examples/async.py`)."""
    return demo_config(model, async_sampling=True, max_staleness=max_staleness, **training)
