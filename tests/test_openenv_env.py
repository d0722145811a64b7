"""OpenEnv environments as multi-turn environments, for real: openenv-core's server (the built-in ``modsum`` game,
`rllib_p3o.envs.openenv_modsum`) on 127.0.0.1, started by the adapter, and P3O training on it (Ray, RLlib, vLLM)."""

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.envs.openenv_env import OpenEnvEnv, OpenEnvError, serve_app
from rllib_p3o.envs.openenv_modsum import MAX_TRIES

APP = "rllib_p3o.envs.openenv_modsum:app"
SYSTEM = [{"role": "system", "content": "add"}]


def _answer(question: str) -> str:
    a, b = question[1:3], question[4:6]  # "(ab+cd)%10="
    return str((int(a) + int(b)) % 10)


def test_reset_and_step_map_onto_turns_of_a_served_environment(processes):
    env = OpenEnvEnv({"openenv": {"app": APP, "reset_column": "reset_kwargs"}})
    assert env.url.startswith("http://127.0.0.1:")
    row = {"prompt": SYSTEM, "reset_kwargs": {"seed": 7}}
    prompt = env.reset(row)
    # The row's prompt, then reset's observation as the environment's message.
    assert prompt[:1] == SYSTEM and prompt[1]["role"] == "user" and prompt[1]["content"].endswith("%10=")
    question = prompt[1]["content"]
    wrong = str((int(_answer(question)) + 1) % 10)
    env.prepare_step({"role": "assistant", "content": wrong})  # as the runner does: sent now, read in step
    result = env.step({"role": "assistant", "content": wrong})
    assert result.messages == [{"role": "user", "content": question}] and result.reward == 0.0
    assert not result.terminated
    result = env.step({"role": "assistant", "content": _answer(question)})  # without prepare_step works too
    assert result.messages == [] and result.reward == 1.0 and result.terminated
    assert env.metrics() == {"openenv_steps": 2.0}
    env.close()
    # The same seed gives the same start in another session; the runner's server is shared by its episodes.
    again = OpenEnvEnv({"openenv": {"app": APP, "reset_column": "reset_kwargs"}})
    assert again.url == env.url and again.reset(row)[1]["content"] == question
    for _ in range(MAX_TRIES - 1):
        assert not again.step({"role": "assistant", "content": wrong}).terminated
    assert again.step({"role": "assistant", "content": wrong}).terminated  # out of tries, reward 0
    again.close()

    # A server that is already running, by URL, with string prompts: the observation is appended to the text.
    by_url = OpenEnvEnv({"openenv": {"url": serve_app(APP), "observation_field": "question"}})
    assert by_url.reset({"prompt": "add "}).startswith("add (")
    by_url.close()


def test_openenv_mistakes_fail_with_what_to_change(processes):
    with pytest.raises(ValueError, match="exactly one of 'app' and 'url'"):
        OpenEnvEnv({"openenv": {}})
    with pytest.raises(ValueError, match=r"unknown keys \['action'\]"):
        OpenEnvEnv({"openenv": {"url": "http://127.0.0.1:1", "action": "x"}})
    with pytest.raises(ValueError, match="needs env_config\\['openenv'\\]"):
        OpenEnvEnv({})
    env = OpenEnvEnv({"openenv": {"app": APP, "action_field": "text"}})
    env.reset({"prompt": "q"})
    with pytest.raises(OpenEnvError, match=r"refused step.*\['action_field'\] names the environment's Action field"):
        env.step({"role": "assistant", "content": "1"})
    env.close()
    env = OpenEnvEnv({"openenv": {"app": APP, "observation_field": "board"}})
    with pytest.raises(OpenEnvError, match=r"no field 'board' \(fields: \['question'\]\)"):
        env.reset({"prompt": "q"})
    env.close()
    with pytest.raises(OpenEnvError, match="cannot reach the OpenEnv server at http://127.0.0.1:9"):
        OpenEnvEnv({"openenv": {"url": "http://127.0.0.1:9"}}).reset({"prompt": "q"})
    with pytest.raises(OpenEnvError, match="(?s)app 'no_such_env_module:app' exited .*Could not import module"):
        serve_app("no_such_env_module:app", startup_timeout_s=30)


def test_p3o_trains_on_an_openenv_environment(ray_session, tiny_chat_model):
    """Two iterations of P3O on the modsum game, the server started by the runner, a session per episode."""
    rows = [{"prompt": SYSTEM, "reset_kwargs": {"seed": s}} for s in range(8)]
    config = (
        P3OConfig()
        .environment(
            env_config={
                "dataset": rows,
                "multi_turn_env": OpenEnvEnv,
                "openenv": {"app": APP, "reset_column": "reset_kwargs"},
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
        assert 0 < p3o[m.TRAINED_TOKENS] == p3o[m.GENERATED_TOKENS]  # environment turns are masked out
        assert 0.0 <= p3o[m.REWARD_MEAN] <= 1.0
        turns = m.lookup(result, "env_runners", m.MULTI_TURN, "turns")
        steps = m.lookup(result, "env_runners", m.MULTI_TURN, "openenv_steps")
        assert 1 <= turns <= MAX_TRIES and steps == pytest.approx(turns)  # every model turn was one step
