"""verifiers environments (the real verifiers 0.4 package) as multi-turn environments: a taskset's tasks as prompt rows,
its Env's coroutine played turn by turn with the policy as its seat, the task's rewards as the episode's reward, and
P3O training on a single-turn and a multi-turn environment (real Ray, RLlib, vLLM). The environments are the small
local ones in `rllib_p3o.tasks` (no download)."""

import json
import sys
import types

import pytest
import verifiers.v1 as vf

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.envs.verifiers_env import VerifiersEnv
from rllib_p3o.envs.verifiers_modsum import question
from rllib_p3o.envs.verifiers_modsum_game import MAX_TRIES
from rllib_p3o.envs.verifiers_tasks import ENV_COLUMN, KEY_COLUMN, VerifiersError, verifiers_dataset

TASKSET = {"id": "rllib_p3o.envs.verifiers_modsum", "size": 6}
SINGLE = {"taskset": TASKSET}
GAME = {"id": "rllib_p3o.envs.verifiers_modsum_game", "taskset": TASKSET}


def _say(env, text):
    return env.step({"role": "assistant", "content": text})


def test_taskset_rows_and_a_single_turn_episode_scored_by_the_task(processes):
    rows = verifiers_dataset(SINGLE)
    assert len(rows) == 6
    text, answer = question(0)
    assert rows[0]["prompt"] == [{"role": "system", "content": "add"}, {"role": "user", "content": text}]
    env = VerifiersEnv({})
    assert env.reset(rows[0]) == rows[0]["prompt"]  # the runner's prompt is the task's opening conversation
    result = _say(env, answer + "7")
    assert result.terminated and not result.truncated and result.messages == [] and result.reward == 1.0
    assert env.rewards_by_function() == {"correct": 1.0}
    assert env.metrics() == {"vf_answer_length": 2.0}
    env.reset(rows[0])
    assert _say(env, str((int(answer) + 1) % 10)).reward == 0.0
    env.close()
    # The taskset's own options (its seed) and a limit: other tasks.
    other = verifiers_dataset({"taskset": {**TASKSET, "seed": 3}}, limit=2)
    assert len(other) == 2 and other[0]["prompt"] == rows[3]["prompt"] and other[0][KEY_COLUMN] != rows[0][KEY_COLUMN]


def test_a_multi_turn_environment_is_played_turn_by_turn(processes):
    rows = verifiers_dataset(GAME)
    text, answer = question(0)
    wrong = str((int(answer) + 1) % 10)
    env = VerifiersEnv({"max_turns": 8})
    env.reset(rows[0])
    # A wrong answer: the environment's coroutine sends the question again as the next user turn.
    result = _say(env, wrong)
    assert result.messages == [{"role": "user", "content": text}] and result.reward == 0.0 and not result.terminated
    result = _say(env, answer)
    assert result.terminated and result.reward == 1.0 and env.metrics()["vf_tries"] == 2.0
    # Out of tries: the last answer is scored, 0.
    env.reset(rows[0])
    results = [_say(env, wrong) for _ in range(MAX_TRIES)]
    assert [r.terminated for r in results] == [False] * (MAX_TRIES - 1) + [True] and results[-1].reward == 0.0
    # The runner's max_turns ends the exchange as verifiers' turn limit does: scored, truncated.
    env = VerifiersEnv({"max_turns": 1})
    env.reset(rows[0])
    result = _say(env, wrong)
    assert result.truncated and not result.terminated and result.reward == 0.0
    env.reset(rows[1])  # a reset mid-episode cancels the open one
    env.close()


def _module(name, **attributes):
    module = types.ModuleType(name)
    module.__dict__.update(attributes, __all__=list(attributes))
    sys.modules[name] = module
    return name


class _TwoSeatsConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    user: vf.AgentConfig = vf.AgentConfig()


class _TwoSeatsEnv(vf.Env[_TwoSeatsConfig]):
    async def run(self, task, agents):
        await agents.user.run(task)


class _BrokenData(vf.TaskData):
    answer: str = ""


class _BrokenTask(vf.Task[_BrokenData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exploding(self, trace: vf.Trace) -> float:
        raise ZeroDivisionError("the reward's own bug")


class _BrokenTaskset(vf.Taskset[_BrokenTask, vf.TasksetConfig]):
    def load(self):
        yield _BrokenTask(_BrokenData(prompt="1+1="), self.config.task)


class _OpenedByEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """The environment speaks first: the task has no prompt, run() sends the question as the first user turn."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task.with_data(prompt=None)) as chat:
            await chat.turn(task.data.prompt)


def test_an_environment_that_opens_the_exchange(processes):
    rows = verifiers_dataset({"id": _module("vf_test_opened", OpenedByEnv=_OpenedByEnv), "taskset": TASKSET})
    text, answer = question(0)
    env = VerifiersEnv({})
    # The runner's prompt is the system prompt, then the environment's opening turn.
    assert env.reset(rows[0]) == [{"role": "system", "content": "add"}, {"role": "user", "content": text}]
    result = _say(env, answer)
    assert result.terminated and result.reward == 1.0


def test_what_the_adapter_cannot_play_fails_with_what_to_change(processes):
    with pytest.raises(VerifiersError, match="cannot load the environment.*no_such_verifiers_env"):
        verifiers_dataset("no_such_verifiers_env")
    with pytest.raises(VerifiersError, match="no seat 'player'"):
        verifiers_dataset(SINGLE, seat="player")
    two_seats = {"id": _module("vf_test_two_seats", TwoSeatsEnv=_TwoSeatsEnv), "taskset": TASKSET}
    with pytest.raises(VerifiersError, match=r"seats \['solver', 'user'\]: name the one the policy plays"):
        verifiers_dataset(two_seats)
    rows = verifiers_dataset(two_seats, seat="solver")
    env = VerifiersEnv({})
    with pytest.raises(VerifiersError, match="uses the seat 'user'; VerifiersEnv plays one seat, 'solver'"):
        env.reset(rows[0])
    # A row made by another version of the environment: the task at that index has another key.
    row = dict(verifiers_dataset(SINGLE)[1], **{KEY_COLUMN: "0" * 64})
    with pytest.raises(VerifiersError, match="has key .* the row was made from 000000000000"):
        VerifiersEnv({}).reset(row)
    with pytest.raises(VerifiersError, match="no \\['verifiers_env'\\] column"):
        VerifiersEnv({}).reset({"prompt": "q", "verifiers_task": 0})
    # A reward function that raises: the runner names the environment class and the prompt.
    broken = verifiers_dataset({"taskset": {"id": _module("vf_test_broken", BrokenTaskset=_BrokenTaskset)}})
    env = VerifiersEnv({})
    env.reset(broken[0])
    with pytest.raises(
        VerifiersError, match="task 0: task _BrokenTask scoring: ZeroDivisionError: the reward's own bug"
    ):
        _say(env, "2")
    assert json.loads(broken[0][ENV_COLUMN])["env"]["taskset"]["id"] == "vf_test_broken"


@pytest.mark.parametrize("env", [SINGLE, GAME], ids=["single-turn", "multi-turn"])
def test_p3o_trains_on_a_verifiers_environment(ray_session, tiny_chat_model, env):
    """Two iterations of P3O on the verifiers modsum taskset, alone and as the game of tries."""
    config = (
        P3OConfig()
        .environment(
            env_config={
                "dataset": verifiers_dataset(env),
                "multi_turn_env": VerifiersEnv,
                "max_turns": MAX_TRIES,
                # Digits end a model turn too, so that the random tiny model's turns are answers.
                "stop_tokens": ["<|im_end|>"] + [str(d) for d in range(10)],
            }
        )
        .training(model=tiny_chat_model, group_size=4, prompts_per_step=4, max_tokens=4)
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
        assert 0 < p3o[m.TRAINED_TOKENS] == p3o[m.GENERATED_TOKENS]  # user turns are masked out
        assert 0.0 <= p3o[m.REWARD_MEAN] <= 1.0
        assert "correct" in p3o[m.REWARDS]  # the task's reward, logged by name
        turns = m.lookup(result, "env_runners", m.MULTI_TURN, "turns")
        length = m.lookup(result, "env_runners", m.MULTI_TURN, "vf_answer_length")
        assert length >= 0
        if env is SINGLE:
            assert turns == 1
        else:
            # The environment's own count of the seat's turns; episodes cut by max_tokens end before it is scored.
            assert 1 <= turns <= MAX_TRIES and 0 < m.lookup(result, "env_runners", m.MULTI_TURN, "vf_tries") <= turns
