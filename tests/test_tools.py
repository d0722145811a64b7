"""Tool calls in worker processes, for real (processes, pipes, signals and rlimits; nothing faked): a call past its
timeout is killed and never acts afterwards, calls queued behind it are not timed out, a tool that never returns, a
tool that allocates without bound, one that burns CPU and one that crashes its process are each stopped and reported
to the model, and the pool replaces the workers it lost. The last test plays them in a real vLLM runner."""

import ctypes
import functools
import importlib
import os
import sys
import time

import psutil
import pytest

from rllib_p3o.runner.multiturn import ToolEnv, run_tool
from rllib_p3o.runner.tool_pool import ToolError, close_pools, tool_pool


@pytest.fixture(autouse=True)
def _no_pools_left():
    yield
    close_pools()


def _write_after(path, seconds):
    time.sleep(seconds)
    with open(path, "w") as f:
        f.write("the tool ran after it was reported timed out")
    return "done"


def _forever(_):
    while True:
        pass


def _allocate_forever(_):
    hoard = []
    while True:
        hoard.append(bytearray(16 * 2**20))


def _segfault(_):
    ctypes.string_at(0)


def _reward(prompts, completions, **_):
    return [0.0] * len(completions)


def _env_config(tools, **extra):
    return {"tools": tools, "reward_fn": _reward, **extra}


def _assistant(text):
    return {"role": "assistant", "content": text}


def test_a_call_past_its_timeout_is_killed_and_the_quick_calls_queued_behind_it_are_not_timed_out(processes, tmp_path):
    tools = {"slow": _write_after, "quick": lambda x: f"quick {x}"}
    config = _env_config(tools, tool_timeout_s=0.5, tool_workers=2)
    # One turn of six episodes, as the runner plays it: every episode's call starts (`prepare_step`), then each is
    # answered (`step`). The two slow calls hold both workers; the four quick ones wait for a worker, then run.
    calls = [
        f'<tool_call>{{"name": "slow", "arguments": {{"path": "{tmp_path / f"late{i}"}", "seconds": 3}}}}'
        for i in range(2)
    ]
    calls += [f"<tool_call>quick({i})" for i in range(4)]
    envs = [ToolEnv(config) for _ in calls]
    for env, text in zip(envs, calls):
        env.reset({"prompt": "p"})
        env.prepare_step(_assistant(text))
    results = [env.step(_assistant(text)).messages[0]["content"] for env, text in zip(envs, calls)]
    assert results == ["error: tool slow timed out after 0.5 s"] * 2 + [f"quick {i}" for i in range(4)]
    assert [env.metrics()["tool_errors"] for env in envs] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    time.sleep(4)  # past the moment the slow calls would have written their files
    assert not list(tmp_path.iterdir()), "a call reported as timed out ran on"


def test_a_tool_that_never_returns_is_killed_and_its_worker_replaced(processes):
    tools = {"forever": _forever, "quick": lambda x: x.upper()}
    assert run_tool(tools, "quick", "warm", timeout_s=5, workers=2) == ("WARM", True)
    pool = tool_pool(tools, 2)
    before = set(pool.worker_pids())
    assert run_tool(tools, "forever", "x", timeout_s=0.5, workers=2) == (
        "error: tool forever timed out after 0.5 s",
        False,
    )
    killed = before - set(pool.worker_pids())
    assert len(killed) == 1 and not psutil.pid_exists(killed.pop())
    assert run_tool(tools, "quick", "again", timeout_s=5, workers=2) == ("AGAIN", True)
    deadline = time.time() + 30
    while len(pool.worker_pids()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert len(pool.worker_pids()) == 2  # the pool is back to its size


def test_memory_cpu_and_crashes_are_bounded_and_reported(processes):
    tools = {
        "allocate": _allocate_forever,
        "spin": _forever,
        "exit": lambda _: os._exit(3),
        "segfault": _segfault,
        "raises": lambda _: 1 / 0,
        "quick": lambda x: x,
    }
    text, ok = run_tool(tools, "allocate", "x", timeout_s=60, memory_mb=256)
    assert (text, ok) == ("error: tool allocate ran out of memory (its limit is 256 MiB)", False)
    text, ok = run_tool(tools, "spin", "x", timeout_s=120, cpu_s=1)  # CPU time, not wall time, ends it
    assert (text, ok) == ("error: tool spin used up its CPU time limit (1 s) and was stopped", False)
    assert run_tool(tools, "exit", "x", timeout_s=5) == ("error: tool exit crashed its process (exit status 3)", False)
    assert run_tool(tools, "segfault", "x", timeout_s=5) == (
        "error: tool segfault crashed its process (SIGSEGV)",
        False,
    )
    text, ok = run_tool(tools, "raises", "x", timeout_s=5)
    assert not ok and text == "error: ZeroDivisionError: division by zero"
    assert run_tool(tools, "quick", "still here", timeout_s=5) == ("still here", True)


def test_tools_that_cannot_travel_to_a_worker_are_configuration_errors(processes, tmp_path):
    import threading

    lock = threading.Lock()
    with pytest.raises(ToolError, match=r"tool 'locked' .* cannot be pickled for its worker process"):
        ToolEnv(_env_config({"locked": lambda x: (lock, x)}))

    # A callable that travels by reference, to a module the workers cannot import.
    (tmp_path / "runner_only_tools.py").write_text("def shout(x):\n    return x.upper()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("runner_only_tools")
    finally:
        sys.path.remove(str(tmp_path))
    tools = {"shout": functools.partial(module.shout)}
    with pytest.raises(ToolError, match=r"tool 'shout' cannot be loaded in its worker process: ModuleNotFoundError"):
        run_tool(tools, "shout", "x", timeout_s=5)
    # A plain function travels by value: its module need not be importable in the worker.
    assert run_tool({"shout": module.shout}, "shout", "x", timeout_s=5) == ("X", True)


# -- in a runner ------------------------------------------------------------------------------------------------------

# Turn k's tool, whatever the model wrote (the random tiny model writes no tool calls); the turn after is the answer.
PLAN = ("forever", "allocate", "exit")
OUTCOMES = {"timed out": "timed_out", "ran out of memory": "out_of_memory", "crashed its process": "crashed"}


class ScriptedToolEnv(ToolEnv):
    """Calls the plan's tools in turn, and counts what the model was told (`metrics`, in the episode's infos). The
    order of `prepare_step` and `step` calls goes to the class's ``log`` (in the runner process)."""

    log = []

    def reset(self, row):
        self.turn, self.told = 0, dict.fromkeys(OUTCOMES.values(), 0.0)
        return super().reset(row)

    def parse_call(self, text):
        self.turn += 1
        return (PLAN[self.turn - 1], "x") if self.turn <= len(PLAN) else None

    def prepare_step(self, assistant):
        super().prepare_step(assistant)
        self.log.append(("prepare", self.turn))

    def step(self, assistant):
        self.log.append(("step", self.turn))
        result = super().step(assistant)
        for phrase, key in OUTCOMES.items():
            self.told[key] += any(phrase in m["content"] for m in result.messages)
        return result

    def metrics(self):
        return {**super().metrics(), **self.told}


def test_a_runner_survives_tools_that_hang_allocate_and_crash(ray_session, tiny_chat_model):
    import ray
    from ray import cloudpickle
    from transformers import AutoTokenizer

    from rllib_p3o import P3OConfig
    from rllib_p3o.runner.env_runner import VLLMEnvRunner

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the runner cannot import this test module
    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    # Every token ends a model turn: each turn is one token, never cut by max_tokens, so every episode plays the plan.
    every_token = [t for t in tok.convert_ids_to_tokens(list(range(len(tok)))) if t != tok.unk_token]
    env_config = {
        "dataset": [{"prompt": [{"role": "user", "content": f"({a}+{b})%10="}]} for a, b in [(1, 2), (3, 4)]],
        "multi_turn_env": ScriptedToolEnv,
        "tools": {"forever": _forever, "allocate": _allocate_forever, "exit": lambda _: os._exit(3)},
        "reward_fn": _reward,
        "tool_timeout_s": 3,
        "tool_memory_mb": 256,
        "max_turns": len(PLAN) + 1,
        "stop_tokens": every_token,
    }
    config = (
        P3OConfig()
        .environment(env_config=env_config)
        .training(model=tiny_chat_model, group_size=2, prompts_per_step=2, max_tokens=4)
        .env_runners(num_env_runners=1)
    )
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(config=config, worker_index=1, num_workers=1)
    try:
        for _ in range(2):  # the second sample() finds the runner (and its tool pool) working
            episodes = ray.get(runner.sample.remote(num_prompts=2))
            infos = [ep.get_infos(-1) for ep in episodes]
            assert len(infos) == 4 and all(ep.is_terminated for ep in episodes)
            for info in infos:
                assert info["tool_calls"] == 3 and info["tool_errors"] == 3
                assert info["timed_out"] == info["out_of_memory"] == info["crashed"] == 1.0
            log = ray.get(runner.__ray_call__.remote(_take_log))
            # Each turn's calls start before any of them is waited for: they run at once, up to the pool's size.
            for turn in range(1, len(PLAN) + 2):
                assert [kind for kind, t in log if t == turn] == ["prepare"] * 4 + ["step"] * 4, turn
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)


def _take_log(runner):
    env_cls = runner.config.env_config["multi_turn_env"]
    log, env_cls.log = env_cls.log, []
    return log
