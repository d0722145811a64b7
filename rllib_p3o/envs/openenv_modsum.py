"""A tiny OpenEnv environment (``openenv-core``): the demo's ``(a+b)%10`` as a game of several tries.

``reset(seed)`` draws ``a`` and ``b`` from the seed and shows ``"(a+b)%10="``; each ``step`` takes the answer in the
action's ``message``: right ends the episode with reward 1, wrong shows the question again (reward 0) until
``MAX_TRIES`` answers have been given. Served as a FastAPI app, ``app`` here, so that
``env_config["openenv"] = {"app": "rllib_p3o.envs.openenv_modsum:app"}`` has each runner serve it on 127.0.0.1
(docs/guide/environments.md; ``examples/openenv_env.py`` trains on it, the tests run it). Its text is in the tiny
models' vocabulary (digits and arithmetic signs).
"""

from __future__ import annotations

import random

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_TRIES = 3
MODULUS = 10


class ModSumAction(Action):
    message: str


class ModSumObservation(Observation):
    question: str = ""


class ModSumEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session has its own instance

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.question, self.answer = "", ""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> ModSumObservation:
        rng = random.Random(seed)
        a, b = rng.randrange(100), rng.randrange(100)
        self.question, self.answer = f"({a:02d}+{b:02d})%{MODULUS}=", str((a + b) % MODULUS)
        self._state = State(episode_id=episode_id, step_count=0)
        return ModSumObservation(question=self.question, done=False, reward=0.0)

    def step(self, action: ModSumAction, timeout_s: float | None = None, **kwargs) -> ModSumObservation:
        self._state.step_count += 1
        if action.message.strip().startswith(self.answer):
            return ModSumObservation(question="", done=True, reward=1.0)
        out_of_tries = self._state.step_count >= MAX_TRIES
        return ModSumObservation(question="" if out_of_tries else self.question, done=out_of_tries, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


# 256 sessions: every episode of a runner's sample() call holds one at once.
app = create_app(ModSumEnvironment, ModSumAction, ModSumObservation, env_name="modsum", max_concurrent_envs=256)
