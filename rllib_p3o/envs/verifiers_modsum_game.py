"""A tiny multi-turn verifiers environment: `rllib_p3o.envs.verifiers_modsum`'s question as a game of tries.

The environment is the control flow of an exchange with its one seat, ``agent``, as verifiers' multi-turn
environments are written: it takes the agent's first answer, and while the answer is wrong and tries are left it
sends the question again as the next user turn. The task's ``correct`` reward then scores the last answer. Loaded by
id beside its taskset: ``{"id": "rllib_p3o.envs.verifiers_modsum_game", "taskset": {"id":
"rllib_p3o.envs.verifiers_modsum"}}``.
"""

from __future__ import annotations

import verifiers.v1 as vf

MAX_TRIES = 3


class ModSumGameConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    tries: int = MAX_TRIES
    """Answers the agent may give."""


class ModSumGameEnv(vf.Env[ModSumGameConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()  # the task's prompt opens the exchange
            for _ in range(self.config.tries - 1):
                if segment.terminated or segment.last_reply.startswith(task.data.answer):
                    break
                segment = await chat.turn(task.data.prompt)

    async def finalize(self, task, episode):
        (trace,) = episode.traces
        trace.record_metric("tries", float(trace.num_turns))


__all__ = ["ModSumGameEnv"]
