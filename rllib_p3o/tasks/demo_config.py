"""The built-in demo setting: the arithmetic task, its base model and the P3O config that trains it on 2 CPU cores."""

from __future__ import annotations

from typing import Any

from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.arithmetic import ArithmeticTask, arithmetic_reward
from rllib_p3o.tasks.task_config import task_config


def demo_config(model_path: str, **training: Any) -> P3OConfig:
    """64 prompts x 8 completions per iteration, 2 optimizer steps per iteration (minibatches of 256 completions),
    greedy held-out eval every 5 iterations (at the start of the iteration, so the first point is the untrained model).

    The base model knows the operation but answers it sloppily (see `ArithmeticTask.pretraining_corpus`), so
    most prompt groups hold reward variance from the first iteration. Two optimizer steps per iteration: with an
    earlier base model that answered at chance, 4 steps shortened the search on one base model and collapsed the
    policy on another (the reward did not favour any digit overall, so sampling noise alone shrank the entropy).

    The learning rate warms up linearly over the first 10 iterations (5120 sampled completions): Adam's first
    steps move every weight by ~lr, which at full lr can wreck a small model before any learning happens.
    """
    task = ArithmeticTask()
    options = {"max_tokens": 3, "minibatch_size": 256, **training}
    return task_config(model_path, task.train_rows(), task.heldout_rows(), arithmetic_reward, **options)
