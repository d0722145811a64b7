"""Multi-turn environments: the API a user subclasses, and `ToolEnv`, a tool-calling environment built on it.

An episode alternates model turns and environment turns (gymnasium-style, one instance per episode):

    messages = env.reset(row)                     # the first messages (or a string prompt)
    while True:
        <the policy generates an assistant turn, text>  # turn k of every active episode: one vLLM call
        env.prepare_step({"role": "assistant", "content": text})  # optional: every episode's before any step
        result = env.step({"role": "assistant", "content": text})
        # result.messages: the next messages (a user turn, tool results), result.reward: this turn's reward,
        # result.terminated / result.truncated: the episode ends

The runner (`rllib_p3o.runner.rollouts`) plays every episode of a sample() call at once: turn k of all active episodes is
one vLLM call. It keeps the token sequence itself (engine ids for model turns, the template's encoding of
environment turns; `rllib_p3o.data.chat`), so `step` sees text but never decides tokens. Episode return = the sum of the
turn rewards (outcome rewards: 0 until the last turn); advantages are normalized over a prompt group's episodes and
apply to every model token of the episode.

Plugged in through ``env_config``:
    ``multi_turn_env``: a `MultiTurnEnv` subclass (or ``"module:Class"``); it is built as ``cls(env_config)``.
    ``max_turns`` (default 4): model turns per episode; an episode still running after them is truncated.
    ``max_total_tokens``: prompt + all turns; a turn that would pass it ends the episode, truncated.
    ``stop_tokens``: token strings that end a model turn besides EOS (e.g. ``"<|im_end|>"``, ``"</tool_call>"``).
Per-turn new tokens are the config's ``max_tokens``; a turn that hits it without a stop token ends the episode,
truncated (it cannot continue sensibly mid-sentence).
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from rllib_p3o.data.chat import Message, Messages, Prompt, is_conversational
from rllib_p3o.data.datasets import Row
from rllib_p3o.data.rewards import RewardFunction, make_reward_function
from rllib_p3o.runner.tool_pool import (  # noqa: F401  (ToolError: public here)
    DEFAULT_MEMORY_MB,
    DEFAULT_WORKERS,
    ToolError,
    ToolLimits,
    tool_pool,
)

DEFAULT_MAX_TURNS = 4
logger = logging.getLogger(__name__)


class TurnResult(NamedTuple):
    """What `MultiTurnEnv.step` returns after a model turn."""

    messages: Union[Messages, str]  # the environment's next turn (messages, or text without a chat template)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Dict[str, Any] = {}


class MultiTurnEnvError(RuntimeError):
    """A user environment raised or returned something invalid; the message names the class and the prompt."""


class MultiTurnEnv:
    """Base class of a multi-turn environment: one instance per episode, built as ``cls(env_config)``.

    Subclasses implement `step` and may override `reset` (default: the row's ``prompt``, a string or chat
    messages) and `render_text` (how messages read when the tokenizer has no chat template).
    """

    def __init__(self, config: Mapping[str, Any]):
        self.config = config

    def reset(self, row: Row) -> Prompt:
        """The episode's first messages (or a string prompt) for dataset row ``row``."""
        self.row = row
        return row["prompt"]

    def prepare_step(self, assistant: Message) -> None:
        """Called with the assistant turn of every active episode of a turn before `step` is called on any of them
        (turn k of all episodes is one vLLM call; their `step` calls follow one another). Start slow work here
        without waiting for it, so that the turn's episodes do theirs at once: `ToolEnv` starts its tool call.
        The default does nothing."""

    def step(self, assistant: Message) -> TurnResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def render_text(self, messages: Messages) -> str:
        """Environment messages as plain text, for tokenizers without a chat template."""
        return "".join(m["content"] for m in messages)

    def metrics(self) -> Dict[str, float]:
        """Per-episode counters added to the episode's infos and the runner's metrics (e.g. tool calls)."""
        return {}

    def rewards_by_function(self) -> Dict[str, float]:
        """Each reward function's value for the episode, by name (logged per function and shown in the completion
        samples); empty when the environment has no named reward functions."""
        return {}

    def close(self) -> None:
        """Called once when the runner is done with the episode, however it ended (terminated, truncated by a limit,
        or an error in another episode of the call): release what `reset` opened, such as a server session. The
        default does nothing."""


# A terminating turn may return reward NaN with this key set in its info: no reward function scored the episode
# (TRL's None from every function). Its advantage is then 0 and its group's baseline leaves it out.
UNSCORABLE = "unscorable"


# -- tools -----------------------------------------------------------------------------------------------------------

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_SIMPLE_CALL = re.compile(r"^(\w+)\((.*)\)$", re.DOTALL)


def parse_tool_call(text: str) -> Optional[Tuple[str, Union[Dict[str, Any], str]]]:
    """The first tool call in an assistant message, as ``(name, arguments)``, or None.

    Formats inside ``<tool_call>...</tool_call>`` (the closing tag may be absent from the text): JSON
    ``{"name": "calc", "arguments": {"expression": "12*34"}}`` (Hermes/Qwen style: arguments become keyword
    arguments), or the simple ``calc(12*34)`` or ``calc 12*34`` (a name and one string argument).
    """
    m = TOOL_CALL.search(text)
    if m is None:
        return None
    body = m.group(1).strip()
    if body.startswith("{"):
        try:
            call = json.loads(body)
            return str(call["name"]), dict(call.get("arguments") or {})
        except (ValueError, KeyError, TypeError):
            return "", body
    call = _SIMPLE_CALL.match(body)
    if call is not None:
        return call.group(1), call.group(2)
    name, _, arg = body.partition(" ")
    return name, arg.strip()


class ToolEnv(MultiTurnEnv):
    """The model may call tools; an answer without a tool call ends the episode and is scored.

    ``env_config``: ``tools`` ``{name: callable}``; ``reward_fn`` (one or a list, with ``reward_weights``; TRL's
    signature, as for single-turn rows) scores the final answer against the row's columns: for a string prompt the
    answer's text, for a conversational prompt the episode's messages after the prompt (assistant turns and tool
    results, ending with the answer), as TRL passes completions of tool-calling episodes. Each call runs in a worker
    process (`rllib_p3o.runner.tool_pool`):
        ``tool_timeout_s`` (default 5): wall-clock seconds from the call's start; then it is killed.
        ``tool_memory_mb`` (default 1024): the worker's address space during the call (None: no limit).
        ``tool_cpu_s`` (default: ``tool_timeout_s``): CPU seconds of the call, all its threads together.
        ``tool_workers`` (default 4): worker processes per runner; a turn's calls run at once up to this many.
    A tool that raises, times out, runs out of memory or CPU time, crashes its process, is unknown or gets malformed
    arguments returns an error message to the model; the runner goes on. A tool that cannot be pickled or loaded
    in a worker raises `rllib_p3o.runner.tool_pool.ToolError` (a configuration error). Tool results go back as
    ``{"role": "tool", "content": ...}`` messages; without a chat template they read
    ``<tool_response>...</tool_response>``.
    """

    def __init__(self, config: Mapping[str, Any]):
        super().__init__(config)
        self.tools: Dict[str, Callable] = dict(config.get("tools") or {})
        self.limits = tool_limits(config)
        self.workers = int(config.get("tool_workers", DEFAULT_WORKERS))
        reward_fn = make_reward_function(config)
        if reward_fn is None:
            raise ValueError("ToolEnv needs env_config['reward_fn'] (TRL signature: prompts, completions, **columns).")
        self.reward_fn: RewardFunction = reward_fn
        if self.tools:  # the first episode starts the runner's workers (and a tool that cannot be pickled raises)
            tool_pool(self.tools, self.workers)
        self.tool_calls = 0
        self.tool_errors = 0
        self.turns: Messages = []  # the episode's messages after the prompt
        self._rewards: Dict[str, float] = {}
        # What `prepare_step` parsed and started: (the assistant text, the call or None, its future or None).
        self._started: Optional[Tuple[str, Any, Optional[Future]]] = None

    def reset(self, row: Row) -> Prompt:
        self.turns = []
        return super().reset(row)

    def parse_call(self, text: str) -> Optional[Tuple[str, Union[Dict[str, Any], str]]]:
        """The tool call in an assistant turn's text, ``(name, arguments)``, or None (the turn is the answer).
        Override for another tool-call format; the default is `parse_tool_call`'s."""
        return parse_tool_call(text)

    def prepare_step(self, assistant: Message) -> None:
        call = self.parse_call(assistant["content"])
        future = submit_tool(self.tools, *call, limits=self.limits, workers=self.workers) if call else None
        self._started = (assistant["content"], call, future)

    def step(self, assistant: Message) -> TurnResult:
        self.turns.append(dict(assistant))
        started, self._started = self._started, None
        if started is not None and started[0] == assistant["content"]:
            _, call, future = started  # (the runner's way: `prepare_step` parsed and started it)
        else:
            call = self.parse_call(assistant["content"])
            future = submit_tool(self.tools, *call, limits=self.limits, workers=self.workers) if call else None
        if call is None:
            prompt = self.row["prompt"]
            completion = list(self.turns) if is_conversational(prompt) else assistant["content"]
            rewards = self.reward_fn.score([prompt], [completion], [self.row])
            self._rewards = dict(zip(self.reward_fn.names, rewards.by_function[0].tolist()))
            reward = float(rewards.total[0])
            return TurnResult([], reward=reward, terminated=True, info={UNSCORABLE: reward != reward})
        self.tool_calls += 1
        result, ok = future.result()
        self.tool_errors += not ok
        message = {"role": "tool", "content": result}
        self.turns.append(message)
        return TurnResult([message])

    def render_text(self, messages: Messages) -> str:
        return "".join(
            f"<tool_response>{m['content']}</tool_response>" if m["role"] == "tool" else m["content"] for m in messages
        )

    def metrics(self) -> Dict[str, float]:
        return {"tool_calls": float(self.tool_calls), "tool_errors": float(self.tool_errors)}

    def rewards_by_function(self) -> Dict[str, float]:
        return dict(self._rewards)


def tool_limits(env_config: Mapping[str, Any]) -> ToolLimits:
    """The per-call limits ``env_config`` sets (`ToolEnv`)."""
    timeout_s = float(env_config.get("tool_timeout_s", 5.0))
    memory_mb = env_config.get("tool_memory_mb", DEFAULT_MEMORY_MB)
    cpu_s = env_config.get("tool_cpu_s", timeout_s)
    return ToolLimits(
        timeout_s=timeout_s,
        memory_mb=int(memory_mb) if memory_mb is not None else None,
        cpu_s=float(cpu_s) if cpu_s is not None else None,
    )


def submit_tool(
    tools: Mapping[str, Callable],
    name: str,
    arguments: Union[Dict[str, Any], str],
    *,
    limits: ToolLimits,
    workers: int = DEFAULT_WORKERS,
) -> "Future[Tuple[str, bool]]":
    """Start one tool call in this process's pool for ``tools``; the future gives ``(text for the model,
    succeeded)``. An unknown tool is answered at once."""
    if name not in tools:
        done: Future = Future()
        done.set_result((f"error: unknown tool {name!r} (tools: {', '.join(sorted(tools))})", False))
        return done
    return tool_pool(tools, workers).submit(name, arguments, limits)


def run_tool(
    tools: Mapping[str, Callable],
    name: str,
    arguments: Union[Dict[str, Any], str],
    *,
    timeout_s: float,
    memory_mb: Optional[int] = DEFAULT_MEMORY_MB,
    cpu_s: Optional[float] = None,
    workers: int = DEFAULT_WORKERS,
) -> Tuple[str, bool]:
    """Run one tool call in a worker process and wait; returns ``(text for the model, succeeded)``. Raises only
    `ToolError` (a tool that cannot be pickled or loaded at all)."""
    limits = ToolLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s if cpu_s is not None else timeout_s)
    return submit_tool(tools, name, arguments, limits=limits, workers=workers).result()


def check_turn_result(result: Any, env: MultiTurnEnv) -> TurnResult:
    """``result`` as a `TurnResult`, or `MultiTurnEnvError` naming the env class and what is wrong."""
    name = type(env).__name__
    if not isinstance(result, tuple) or len(result) < 1:
        raise MultiTurnEnvError(
            f"{name}.step must return a TurnResult(messages, reward, terminated, truncated, info), got {result!r:.200}"
        )
    result = TurnResult(*result)
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        raise MultiTurnEnvError(f"{name}.step returned a non-numeric reward {result.reward!r}") from None
    unscorable = reward != reward and result.terminated and bool((result.info or {}).get(UNSCORABLE))
    if (reward != reward and not unscorable) or reward in (float("inf"), float("-inf")):
        prompt = getattr(env, "row", {}).get("prompt")
        raise MultiTurnEnvError(f"{name}.step returned reward {reward} (prompt {prompt!r:.200})")
    return result._replace(reward=reward, info=dict(result.info or {}))


def close_env(env: MultiTurnEnv) -> None:
    """``env.close()``; a failure is logged, not raised: an episode's data is already complete when it closes, and an
    error being raised (another episode's) must not be replaced by this one."""
    try:
        env.close()
    except Exception as e:
        logger.warning("%s.close raised %s: %s", type(env).__name__, type(e).__name__, e)


def max_turns(env_config: Mapping[str, Any]) -> int:
    return int(env_config.get("max_turns", DEFAULT_MAX_TURNS))


def stop_token_ids(tokenizer: Any, tokens: Sequence[str]) -> List[int]:
    """Ids of the ``stop_tokens``; each must be a single token of the tokenizer (stops are checked per token)."""
    ids = []
    for t in tokens:
        tid = tokenizer.convert_tokens_to_ids(t)
        if tid is None or tid == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(tid) != t:
            raise ValueError(f"stop token {t!r} is not a single token of the policy's tokenizer")
        ids.append(int(tid))
    return ids
