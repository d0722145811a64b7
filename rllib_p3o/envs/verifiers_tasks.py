"""verifiers environments (prime-rl's format, verifiers 0.4, the ``envs`` extra): their tasksets as prompt rows.

A verifiers environment is an installed package that exports a ``Taskset`` (its tasks: prompts and the data the
task's ``@vf.reward`` functions score against), and may export an ``Env`` (how one task becomes one episode: a single
answer, or a multi-turn exchange driven by ``agents.<seat>.interaction(task)``). Its configuration is verifiers' own
``EnvConfig``, as its TOML files and ``--env.*`` flags give it: ``{"taskset": {"id": "gsm8k", ...}, "id": ...}``.

`verifiers_dataset` turns that configuration into prompt rows. Each row carries the configuration, the task's index
and its key, so that a runner (`rllib_p3o.envs.verifiers_env.VerifiersEnv`) loads the same environment and plays
the same task; a runner whose environment version yields a different task at that index fails, naming it.

    from rllib_p3o.envs.verifiers_tasks import verifiers_dataset
    from rllib_p3o.envs.verifiers_env import VerifiersEnv

    rows = verifiers_dataset({"taskset": {"id": "my_env"}}, limit=1000)
    config.environment(env_config={"dataset": rows, "multi_turn_env": VerifiersEnv})

A plugin id may also be a dotted module path (``"my_project.envs.sum"``): verifiers imports plugins by their top-level
name, so the module is imported and registered under its last component (``"sum"``) first.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from rllib_p3o.data.chat import Messages
from rllib_p3o.data.datasets import Row

# The row columns a runner reads: the environment (its configuration, as JSON), which task and that task's key.
ENV_COLUMN = "verifiers_env"
TASK_COLUMN = "verifiers_task"
KEY_COLUMN = "verifiers_task_key"
DEFAULT_SEAT = "agent"  # SingleAgentEnv's one seat


class VerifiersError(RuntimeError):
    """A verifiers environment that this adapter cannot play, or a row that no longer matches its environment;
    the message says which and what to change."""


def import_verifiers() -> Any:
    """``verifiers.v1``, or an ImportError that says how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:  # pragma: no cover - the envs extra is part of `make install`
        raise ImportError("verifiers is not installed: pip install 'rllib-p3o[envs]'") from e
    return vf


def _register_dotted(plugin_id: str) -> str:
    """The id verifiers' loader can import: a dotted module path is imported and registered in ``sys.modules`` under
    its last component (verifiers imports plugins by top-level name); other ids are returned as they are."""
    if "." not in plugin_id or "/" in plugin_id or "@" in plugin_id:
        return plugin_id
    module = importlib.import_module(plugin_id)
    short = plugin_id.rsplit(".", 1)[1]
    existing = sys.modules.get(short)
    if existing is not None and existing is not module:
        raise VerifiersError(
            f"verifiers plugin {plugin_id!r} would be registered as {short!r}, which is already the module "
            f"{getattr(existing, '__file__', existing)!r}; rename one of them"
        )
    sys.modules[short] = module
    return short


def _normalized(env: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """``env`` as a configuration dict: a bare string is a taskset id."""
    if isinstance(env, str):
        return {"taskset": {"id": env}}
    if not isinstance(env, Mapping):
        raise TypeError(f"a verifiers environment is a taskset id or an EnvConfig dict, got {type(env).__name__}")
    return json.loads(json.dumps(env))  # a plain, JSON-able copy (the spec travels in every row)


@functools.lru_cache(maxsize=16)
def load_environment(spec: str) -> "LoadedEnvironment":
    """The environment a row's ``verifiers_env`` column describes, loaded once per process."""
    return LoadedEnvironment(json.loads(spec))


class LoadedEnvironment:
    """A verifiers ``Env`` built from its configuration, its tasks listed, the seat the policy plays chosen.

    ``spec``: ``{"env": <EnvConfig dict>, "seat": <name or None>, "limit": <tasks or None>}``.
    """

    def __init__(self, spec: Mapping[str, Any]):
        vf = import_verifiers()
        raw = _normalized(spec["env"])
        taskset = raw.get("taskset")
        if not isinstance(taskset, Mapping) or not taskset.get("id"):
            raise VerifiersError(f"a verifiers environment needs taskset.id, got {raw!r:.300}")
        raw["taskset"] = {**taskset, "id": _register_dotted(str(taskset["id"]))}
        if raw.get("id"):
            raw["id"] = _register_dotted(str(raw["id"]))
        try:
            self.config = vf.resolve_env_config(raw)
            self.env = vf.load_environment(self.config)
        except Exception as e:
            raise VerifiersError(f"verifiers cannot load the environment {raw!r:.300}: {type(e).__name__}: {e}") from e
        self.seats: List[str] = list(self.env._agent_specs)
        self.seat = choose_seat(self.seats, spec.get("seat"))
        self.agent_config = self.env._agent_specs[self.seat]
        self.limit: Optional[int] = spec.get("limit")
        self._check_playable()
        self._tasks: Optional[List[Any]] = None

    @property
    def env_id(self) -> str:
        return self.config.env_id

    def tasks(self) -> List[Any]:
        """The taskset's tasks in ``load()`` order (the first ``limit``), built once."""
        if self._tasks is None:
            taskset = self.env.taskset
            if self.limit is not None:
                taskset = taskset.take(int(self.limit))
            elif not taskset.bounded:
                raise VerifiersError(
                    f"the taskset {self.config.taskset.id!r} is infinite: give verifiers_dataset a limit"
                )
            self._tasks = list(taskset)
            if self._tasks:
                self._check_hooks(self._tasks[0])
        return self._tasks

    def task(self, index: int, key: Optional[str] = None) -> Any:
        """Task ``index``, checked against the key its row recorded."""
        tasks = self.tasks()
        if not 0 <= index < len(tasks):
            raise VerifiersError(
                f"row asks for task {index} of {self.config.taskset.id!r}, which has {len(tasks)} here: the "
                "environment installed on this runner is not the one the rows were made with"
            )
        task = tasks[index]
        if key is not None and task.key != key:
            raise VerifiersError(
                f"task {index} of {self.config.taskset.id!r} has key {task.key[:12]} on this runner, the row was made "
                f"from {key[:12]}: the environment installed here is another version than the one the rows came from"
            )
        return task

    def _check_playable(self) -> None:
        """Refuse what needs verifiers' own machinery (sandboxes, tool servers, model-served judges) up front."""
        task_type = type(self.env.taskset).task_type()
        config = self.env.taskset.config
        what = f"the verifiers environment {self.env_id!r}"
        if getattr(task_type, "NEEDS_CONTAINER", False):
            raise VerifiersError(f"{what}: its tasks need a container runtime, which this adapter does not run")
        if task_type.toolsets(config.task) or type(self.env.taskset).toolsets(config):
            raise VerifiersError(
                f"{what} declares MCP tool servers, which this adapter does not serve; a tool-calling environment "
                "is a ToolEnv here (docs/guide/chat-multiturn-tools.md)"
            )
        if config.task.judges:
            raise VerifiersError(
                f"{what} plugs judges ({[getattr(j, 'id', j) for j in config.task.judges]}), which call a model through verifiers' "
                "clients; serve a judge as a reward model instead (env_config['reward_models'], kind 'judge')"
            )

    def _check_hooks(self, task: Any) -> None:
        """Refuse scoring and stop functions this adapter cannot call, once per process (one task type per
        taskset): those that need a sandbox, and ``@vf.stop`` on a model request or response."""
        vf = import_verifiers()
        from verifiers.v1.session import hook_boundary

        name = type(task).__name__
        needs_runtime = [fn.__name__ for fn in task.hooks("reward") + task.hooks("metric") if requires_runtime(fn)]
        if needs_runtime:
            raise VerifiersError(f"{name}'s {needs_runtime} need a sandbox runtime, which VerifiersEnv does not run")
        for fn in task.hooks("stop"):
            if hook_boundary(fn, allow_trace=True) is not vf.Trace:
                raise VerifiersError(
                    f"{name}.{fn.__name__}: a @vf.stop on a model Request/Response is not supported here (one on the "
                    "Trace is)"
                )


def choose_seat(seats: Sequence[str], seat: Optional[str]) -> str:
    """The seat the policy plays: ``seat``, else ``"agent"``, else the only one."""
    if seat is not None:
        if seat not in seats:
            raise VerifiersError(f"the environment has no seat {seat!r} (its seats: {list(seats)})")
        return seat
    if DEFAULT_SEAT in seats:
        return DEFAULT_SEAT
    if len(seats) == 1:
        return seats[0]
    raise VerifiersError(f"the environment has seats {list(seats)}: name the one the policy plays (seat=...)")


def requires_runtime(fn: Any) -> bool:
    """Whether a reward/metric/stop function needs a sandbox (a ``runtime`` parameter without a default)."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def messages_from_verifiers(messages: Any) -> Messages:
    """verifiers messages (typed or dicts, a string for a user message) as this package's ``{"role", "content"}``
    dicts, content as text."""
    vf = import_verifiers()
    from verifiers.v1.types import content_text

    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    out: Messages = []
    for message in messages:
        if isinstance(message, Mapping):
            role, content = message["role"], message.get("content")
        else:
            role, content = message.role, message.content
        if isinstance(message, vf.AssistantMessage) and message.tool_calls:
            raise VerifiersError("assistant tool calls in a verifiers prompt are not supported here")
        out.append({"role": str(role), "content": content if isinstance(content, str) else content_text(content)})
    return out


def opening_messages(data: Any) -> Tuple[Messages, bool]:
    """A task's opening conversation (its system prompt, then its prompt) and whether the task is prompted (the
    policy answers first) or opened by the environment's first user turn."""
    opening: Messages = []
    if data.system_prompt:
        opening.append({"role": "system", "content": data.system_prompt})
    return opening + messages_from_verifiers(data.prompt), data.prompt is not None


def verifiers_dataset(
    env: Union[str, Mapping[str, Any]],
    *,
    limit: Optional[int] = None,
    seat: Optional[str] = None,
) -> List[Row]:
    """The tasks of a verifiers environment as prompt rows, for `rllib_p3o.envs.verifiers_env.VerifiersEnv`.

    ``env``: verifiers' ``EnvConfig`` as a dict (``{"taskset": {"id": ..., <taskset options>}, "id": <env id>,
    <seats and env options>}``), or a taskset id. ``limit``: the first ``limit`` tasks (required for an infinite
    taskset). ``seat``: the agent seat the policy plays (default ``"agent"``, or the environment's only seat).
    Each row: ``prompt`` (the task's system prompt and prompt; for a task the environment opens, its system prompt,
    or a name when it has none), and the ``verifiers_env``, ``verifiers_task`` and ``verifiers_task_key`` columns the
    runner reads.
    """
    spec = json.dumps({"env": _normalized(env), "seat": seat, "limit": limit}, sort_keys=True)
    loaded = load_environment(spec)
    rows: List[Row] = []
    for index, task in enumerate(loaded.tasks()):
        prompt, _ = opening_messages(task.data)
        # A task the environment opens and without a system prompt has no text of its own before the episode starts
        # (the runner's prompt is what the environment sends); the row names it instead.
        prompt = prompt or f"{loaded.config.taskset.id} task {index}"
        rows.append({"prompt": prompt, ENV_COLUMN: spec, TASK_COLUMN: index, KEY_COLUMN: task.key})
    if not rows:
        raise VerifiersError(f"the verifiers environment {loaded.env_id!r} has no tasks")
    return rows
