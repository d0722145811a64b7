"""A tiny verifiers taskset (verifiers 0.4, the ``envs`` extra): the demo's ``(a+b)%10`` question, one task per seed.

Each task's prompt is ``"(ab+cd)%10="`` under the system prompt ``"add"``; its ``correct`` reward is 1 when the
answer starts with the right digit; its ``answer_length`` metric is the answer's length in characters. It is what a
verifiers environment package looks like: a ``Taskset`` exported through ``__all__``, loaded by id
(``{"taskset": {"id": "rllib_p3o.envs.verifiers_modsum", "size": 100}}``). Played single-turn on its own, or as a
game of several tries with `rllib_p3o.envs.verifiers_modsum_game` (docs/guide/environments.md; the tests and
``examples/environments.py verifiers`` run both). Its text is in the tiny models' vocabulary.
"""

from __future__ import annotations

import random
from typing import Iterator

import verifiers.v1 as vf

MODULUS = 10


def question(seed: int) -> tuple:
    """The question and its answer for ``seed``."""
    rng = random.Random(seed)
    a, b = rng.randrange(100), rng.randrange(100)
    return f"({a:02d}+{b:02d})%{MODULUS}=", str((a + b) % MODULUS)


class ModSumData(vf.TaskData):
    answer: str = ""


class ModSumTask(vf.Task[ModSumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.startswith(self.data.answer))

    @vf.metric
    async def answer_length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ModSumTasksetConfig(vf.TasksetConfig):
    size: int = 100
    """How many tasks (seeds ``seed``, ``seed + 1``, ...)."""
    seed: int = 0


class ModSumTaskset(vf.Taskset[ModSumTask, ModSumTasksetConfig]):
    def load(self) -> Iterator[ModSumTask]:
        for seed in range(self.config.seed, self.config.seed + self.config.size):
            text, answer = question(seed)
            yield ModSumTask(ModSumData(prompt=text, system_prompt="add", answer=answer), self.config.task)


__all__ = ["ModSumTaskset"]
