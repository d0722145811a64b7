"""OpenEnv environments (``openenv-core``, the ``envs`` extra) as multi-turn environments: reset/step onto turns.

An OpenEnv environment is a server (FastAPI, ``openenv.core.env_server.create_app``) that keeps one environment
instance per WebSocket session. `OpenEnvEnv` is a `MultiTurnEnv`, so its episodes go through the same token-exact
machinery as any other (`rllib_p3o.runner.rollouts`): the model's turns are the engine's own ids, the environment's
observations are rendered as turns of their own and masked out of the loss. Each episode is one session:

    reset:  the row's prompt, then the observation ``reset(**row[reset_column])`` returns, as a message
    step:   the assistant's text goes in the action's ``action_field``; the observation comes back as the next
            message, its ``reward`` is the turn's reward, ``done`` ends the episode (terminated)

``env_config``::

    "multi_turn_env": OpenEnvEnv,          # or "rllib_p3o.envs.openenv_env:OpenEnvEnv"
    "openenv": {
        "app": "my_env.server.app:app",    # a FastAPI app (create_app(...)) that each runner serves on 127.0.0.1,
                                           #   in a process of its own, stopped with the runner
        # or "url": "http://host:8000",    # a server already running (one for all runners)
        "action_field": "message",         # the Action field that receives the assistant's text (default "message")
        "observation_field": None,         # the observation field shown to the model (default: every field, as
                                           #   "name: value" lines; a single field alone as its text)
        "reset_column": "reset_kwargs",    # a row column holding reset's keyword arguments, e.g. {"seed": 3}
        "role": "user",                    # the role of the environment's messages
        "startup_timeout_s": 60, "message_timeout_s": 60,
    }

Every episode of a runner's ``sample`` call holds a session at once, so the server's ``max_concurrent_envs`` must be
at least the episodes per call (``prompts_per_step × group_size`` per runner, more with async sampling).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Mapping, Optional

from rllib_p3o.data.chat import Message, Messages, Prompt, is_conversational
from rllib_p3o.data.datasets import Row
from rllib_p3o.runner.multiturn import MultiTurnEnv, TurnResult

CONFIG_KEY = "openenv"
OPTIONS = (
    "app",
    "url",
    "action_field",
    "observation_field",
    "reset_column",
    "role",
    "startup_timeout_s",
    "message_timeout_s",
)


class OpenEnvError(RuntimeError):
    """The OpenEnv server could not be started or reached, or answered with an error; the message says which."""


def openenv_options(env_config: Mapping[str, Any]) -> Dict[str, Any]:
    """``env_config["openenv"]``, checked: exactly one of ``app`` and ``url``, no unknown key."""
    options = env_config.get(CONFIG_KEY)
    if not isinstance(options, Mapping):
        raise ValueError(
            f"OpenEnvEnv needs env_config[{CONFIG_KEY!r}], a dict with 'app' (\"module:app\", served by each runner) "
            f"or 'url' (a running server); got {options!r:.200}"
        )
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env_config[{CONFIG_KEY!r}] has unknown keys {unknown} (known: {', '.join(OPTIONS)})")
    if (options.get("app") is None) == (options.get("url") is None):
        raise ValueError(f"env_config[{CONFIG_KEY!r}] needs exactly one of 'app' and 'url', got {dict(options)}")
    return dict(options)


# -- the server a runner starts ---------------------------------------------------------------------------------------

_SERVE = """
import ctypes, signal, sys
try:  # die with the runner that started this server (Linux)
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
except (OSError, AttributeError):
    pass
import uvicorn
uvicorn.run(sys.argv[1], host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""

_servers: Dict[str, "_Server"] = {}
_servers_lock = threading.Lock()


class _Server:
    """One OpenEnv server process on 127.0.0.1, started from an app's import string."""

    def __init__(self, app: str, startup_timeout_s: float):
        self.app = app
        self.log = tempfile.NamedTemporaryFile(prefix="openenv-", suffix=".log", delete=False)
        # The server imports what this process can: the runner's sys.path goes to the child's PYTHONPATH.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for attempt in range(3):  # a free port can be taken between the probe and the bind: try another
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVE, app, str(self.port)],
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            if self._wait_healthy(startup_timeout_s):
                return
            exited = self.process.poll() is not None
            self.stop()
            if not (exited and "address already in use" in self.log_tail().lower()):
                break
        what = (
            f"exited with code {self.process.returncode}" if exited else f"did not answer within {startup_timeout_s} s"
        )
        raise OpenEnvError(f"the OpenEnv server for app {app!r} {what} (its log, {self.log.name}):\n{self.log_tail()}")

    def _wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def log_tail(self, chars: int = 2000) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_app(app: str, startup_timeout_s: float = 60.0) -> str:
    """The URL of this process's server for ``app`` (``"module:app"``), started on the first call."""
    with _servers_lock:
        server = _servers.get(app)
        if server is None or server.process.poll() is not None:
            server = _servers[app] = _Server(app, startup_timeout_s)
        return server.url


@atexit.register
def stop_servers() -> None:
    """Stop the servers this process started (they also die with it on Linux)."""
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


# -- the environment --------------------------------------------------------------------------------------------------


class OpenEnvEnv(MultiTurnEnv):
    """One OpenEnv session per episode (module docstring): reset/step onto turns, the server's rewards as rewards."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__(config)
        self.options = openenv_options(config)
        self.action_field = str(self.options.get("action_field", "message"))
        self.observation_field = self.options.get("observation_field")
        self.reset_column = self.options.get("reset_column")
        self.role = str(self.options.get("role", "user"))
        self.message_timeout_s = float(self.options.get("message_timeout_s", 60.0))
        if self.options.get("app") is not None:
            self.url = serve_app(str(self.options["app"]), float(self.options.get("startup_timeout_s", 60.0)))
        else:
            self.url = str(self.options["url"]).rstrip("/")
        self._client: Any = None
        self._sent: Optional[str] = None  # the assistant text whose step `prepare_step` sent
        self.steps = 0

    # the session ------------------------------------------------------------------------------------------------

    def _connect(self) -> Any:
        client = _client_class()(self.url, message_timeout_s=self.message_timeout_s)
        try:
            return client.connect()
        except ConnectionError as e:
            raise OpenEnvError(f"cannot reach the OpenEnv server at {self.url}: {e}") from e

    def _check(self, response: Dict[str, Any], what: str) -> Dict[str, Any]:
        if response.get("type") == "error":
            data = response.get("data") or {}
            hint = (
                f"; the action was {{{self.action_field!r}: text}}: env_config['openenv']['action_field'] names the "
                "environment's Action field"
                if what == "step"
                else ""
            )
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} refused {what}: {data.get('message', data)} "
                f"(code {data.get('code', '?')}){hint}"
            )
        return response.get("data") or {}

    def reset(self, row: Row) -> Prompt:
        self.row = row
        self.close()
        self._client = self._connect()
        kwargs = row.get(self.reset_column) if self.reset_column else None
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"row column {self.reset_column!r} must hold reset's keyword arguments as a dict")
        self._client._send({"type": "reset", "data": dict(kwargs or {})})
        result = self._check(self._client._receive(), "reset")
        text = self.observation_text(result.get("observation") or {})
        prompt = row["prompt"]
        if not text:
            return prompt
        if is_conversational(prompt):
            return list(prompt) + [{"role": self.role, "content": text}]
        return prompt + text

    def prepare_step(self, assistant: Message) -> None:
        # Sent now, received in `step`: the servers of a turn's episodes work at once.
        self._client._send({"type": "step", "data": {self.action_field: assistant["content"]}})
        self._sent = assistant["content"]

    def step(self, assistant: Message) -> TurnResult:
        if self._sent != assistant["content"]:  # called without prepare_step (outside the runner)
            self.prepare_step(assistant)
        self._sent = None
        result = self._check(self._client._receive(), "step")
        self.steps += 1
        reward = result.get("reward")
        done = bool(result.get("done"))
        text = self.observation_text(result.get("observation") or {})
        messages: Messages = [] if done or not text else [{"role": self.role, "content": text}]
        return TurnResult(messages, reward=float(reward) if reward is not None else 0.0, terminated=done)

    def observation_text(self, observation: Mapping[str, Any]) -> str:
        """What the model reads of an observation: ``observation_field``'s value, the only field's, or every
        field as ``name: value`` lines. Override for another rendering."""
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise OpenEnvError(
                    f"the observation has no field {self.observation_field!r} (fields: {sorted(observation)}); "
                    "set env_config['openenv']['observation_field']"
                )
            return _text(observation[self.observation_field])
        if len(observation) == 1:
            return _text(next(iter(observation.values())))
        return "\n".join(f"{k}: {_text(v)}" for k, v in observation.items())

    def metrics(self) -> Dict[str, float]:
        return {"openenv_steps": float(self.steps)}

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()  # ends the server's session


@functools.lru_cache(maxsize=None)
def _client_class() -> type:
    """openenv's WebSocket client with the payloads as plain dicts (the server validates them against its Action).
    `OpenEnvEnv` sends a step in `prepare_step` and reads its answer in `step` with the client's ``_send`` and
    ``_receive`` (openenv-core 0.2.0, pinned), so that a turn's servers work at once."""
    from openenv.core.env_client import EnvClient

    class DictClient(EnvClient):
        def _step_payload(self, action: Dict[str, Any]) -> Dict[str, Any]:
            return action

        def _parse_result(self, payload: Dict[str, Any]) -> Any:
            return payload

        def _parse_state(self, payload: Dict[str, Any]) -> Any:
            return payload

    return DictClient


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
