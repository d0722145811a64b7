"""verifiers environments (verifiers 0.4, prime-rl's format) as multi-turn environments: the policy plays one seat.

A verifiers ``Env`` runs an episode as a coroutine, ``run(task, agents)``: it asks an agent for one answer
(``await agents.agent.run(task)``, the single-turn case), or holds an exchange open and sends it user turns
(``async with agents.agent.interaction(task) as chat: segment = await chat.turn(message)``, the multi-turn case), then
the task's ``@vf.reward`` functions score the agent's trace. `VerifiersEnv` plays that coroutine with the policy as
the seat's model: every time the environment waits for the seat's answer, the runner generates a model turn. So its
episodes go through the same token-exact machinery as any `MultiTurnEnv` (`rllib_p3o.runner.rollouts`): the model's
turns are the engine's own ids, the environment's user turns are rendered by the chat template and masked out.

    reset:  the environment's coroutine starts; the first time it asks the seat, the conversation so far (the task's
            system prompt and prompt, or the environment's opening user turn) is the episode's prompt
    step:   the model's answer goes to the waiting ``turn()``/``run()``; the coroutine runs until it asks again (the
            user turn it sent is the next environment message) or ends: then the trace is scored and the episode's
            reward is the trace's weighted reward sum (its rewards and metrics are logged by name)

Rows come from `rllib_p3o.envs.verifiers_tasks.verifiers_dataset`. The other seats of a multi-agent environment (a
simulated user, a judge agent) need a model of their own that this adapter does not serve: an environment that uses
one raises, naming it. The seat's ``max_turns`` and the runner's ``max_turns`` (the smaller) end the exchange as
verifiers' turn limit does: the last turn's answer is scored, the episode counts as truncated. A model turn cut by
``max_tokens`` or ``max_total_tokens`` ends the episode truncated before the environment answers, with reward 0, as
for any multi-turn environment.

The coroutines of a runner's episodes run on one event loop, in a thread of its own; `reset` and `step` wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional

from rllib_p3o.data.chat import Message, Messages, Prompt
from rllib_p3o.data.datasets import Row
from rllib_p3o.envs.verifiers_tasks import (
    ENV_COLUMN,
    KEY_COLUMN,
    TASK_COLUMN,
    LoadedEnvironment,
    VerifiersError,
    import_verifiers,
    load_environment,
    messages_from_verifiers,
    opening_messages,
)
from rllib_p3o.runner.multiturn import MultiTurnEnv, TurnResult, max_turns

vf = import_verifiers()  # the envs extra; an ImportError says how to install it
from verifiers.v1.agent import Segment  # noqa: E402
from verifiers.v1.dialects.chat import parse_message  # noqa: E402
from verifiers.v1.graph import MessageNode  # noqa: E402
from verifiers.v1.session import call_hook  # noqa: E402
from verifiers.v1.trace import AgentInfo, TraceTask  # noqa: E402

METRIC_PREFIX = "vf_"  # the environment's metrics, as runner metrics (env_runners/multi_turn/vf_<name>)


# -- the event loop the episodes' coroutines run on -------------------------------------------------------------------

_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's loop for verifiers coroutines, in a daemon thread (the runner's own thread may have a loop)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="verifiers-episodes", daemon=True).start()
        return _loop


def _wait(coroutine: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, _event_loop()).result()


# -- the environment --------------------------------------------------------------------------------------------------


class VerifiersEnv(MultiTurnEnv):
    """One verifiers episode per episode, the policy playing one seat (module docstring)."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__(config)
        self.max_turns = max_turns(config)
        self._episode: Optional[_Episode] = None
        self._rewards: Dict[str, float] = {}
        self._metrics: Dict[str, float] = {}

    def reset(self, row: Row) -> Prompt:
        self.row = row
        self.close()
        missing = [c for c in (ENV_COLUMN, TASK_COLUMN) if c not in row]
        if missing:
            raise VerifiersError(
                f"VerifiersEnv's rows come from verifiers_dataset(...); this row has no {missing} column(s)"
            )
        loaded = load_environment(str(row[ENV_COLUMN]))
        task = loaded.task(int(row[TASK_COLUMN]), row.get(KEY_COLUMN))
        self._episode = _Episode(loaded, task, self.max_turns)
        # An episode that ends before the exchange is scored (cut by max_tokens) scores 0 on each reward, as its
        # return is 0; scoring replaces these.
        self._rewards = {fn.__name__: 0.0 for fn in task.hooks("reward")}
        self._metrics = {}
        prompt = _wait(self._episode.start())
        if prompt is None:
            raise VerifiersError(
                f"{type(loaded.env).__name__}.run() ended without asking the seat {loaded.seat!r} for a turn"
            )
        return prompt

    def step(self, assistant: Message) -> TurnResult:
        if self._episode is None:
            raise RuntimeError("VerifiersEnv.step before reset")
        messages = _wait(self._episode.answer(assistant["content"]))
        if messages is not None:
            return TurnResult(messages)
        trace = self._episode.trace
        self._rewards = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
        self._metrics = {METRIC_PREFIX + name: float(v) for name, v in trace.metrics.items() if v is not None}
        truncated = bool(trace.is_truncated)
        return TurnResult([], reward=float(trace.reward), terminated=not truncated, truncated=truncated)

    def metrics(self) -> Dict[str, float]:
        return dict(self._metrics)

    def rewards_by_function(self) -> Dict[str, float]:
        return dict(self._rewards)

    def close(self) -> None:
        episode, self._episode = self._episode, None
        if episode is not None and episode.running:  # an episode cut by the runner's limits, or reset mid-way
            _wait(episode.cancel())


class _Episode:
    """One run of the environment's coroutine; `start` and `answer` return the messages the seat is asked to answer,
    or None once the coroutine has ended (the environment's errors are raised)."""

    def __init__(self, loaded: LoadedEnvironment, task: Any, runner_max_turns: int):
        self.loaded = loaded
        self.task = task
        self.runner_max_turns = runner_max_turns
        self.conversation: Optional[_Conversation] = None
        self.traces: List[Any] = []
        self._main: Optional[asyncio.Task] = None
        self._asked: Optional[asyncio.Future] = None
        self._reply: Optional[asyncio.Future] = None

    @property
    def trace(self) -> Any:
        if self.conversation is None:
            raise VerifiersError(f"the seat {self.loaded.seat!r} never played")
        return self.conversation.trace

    async def start(self) -> Optional[Messages]:
        self._asked = asyncio.get_running_loop().create_future()
        self._main = asyncio.ensure_future(self._run())
        return await self._next()

    async def answer(self, text: str) -> Optional[Messages]:
        if self._reply is None or self._reply.done():
            raise RuntimeError("VerifiersEnv.step without a pending turn")
        self._reply.set_result(text)
        return await self._next()

    async def _next(self) -> Optional[Messages]:
        await asyncio.wait({self._main, self._asked}, return_when=asyncio.FIRST_COMPLETED)
        if self._asked.done():
            messages = self._asked.result()
            self._asked = asyncio.get_running_loop().create_future()
            return messages
        self._main.result()  # the environment's own error, if any
        return None

    async def ask(self, messages: Messages) -> str:
        """The seat's model turn: hand ``messages`` (what it has not seen yet) to the runner, wait for the answer."""
        self._reply = asyncio.get_running_loop().create_future()
        self._asked.set_result(messages)
        return await self._reply

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done()

    async def cancel(self) -> None:
        if self.running:
            self._main.cancel()
            await asyncio.gather(self._main, return_exceptions=True)

    async def _run(self) -> None:

        env = self.loaded.env
        agents = vf.Agents(env.config, self._seat)
        await env.setup(agents)
        await env.run(self.task, agents)
        if self.conversation is None:
            raise VerifiersError(f"{type(env).__name__}.run() never gave the seat {self.loaded.seat!r} a turn")
        trace = self.conversation.trace
        episode = vf.Episode(env=vf.EnvInfo(id=env.config.env_id), task=trace.task, traces=self.traces, ok=True)
        await env.finalize(self.task, episode)

    def _seat(self, name: str, config: Any) -> Any:
        return _PolicySeat(self, name, config) if name == self.loaded.seat else _UnplayedSeat(name, self.loaded.seat)

    def open(self, task: Any, seat: str, config: Any, interactive: bool) -> "_Conversation":
        if self.conversation is not None:
            raise VerifiersError(f"the seat {seat!r} is played once per episode here; run() opened a second exchange")
        self.conversation = _Conversation(self, task, seat, config, interactive)
        return self.conversation


class _PolicySeat:
    """The seat the policy plays: ``run`` (one answer) and ``interaction`` (an exchange) as verifiers' ``Agent``."""

    def __init__(self, episode: _Episode, name: str, config: Any):
        self.episode, self.name, self.config = episode, name, config
        self.trainable = True

    async def run(self, task: Any, *, runtime: Any = None, tools: Any = None, **_: Any) -> Any:
        _check_no_resources(runtime, tools)
        conversation = self.episode.open(task, self.name, self.config, interactive=False)
        await conversation.setup()
        if task.data.prompt is None:
            raise VerifiersError(f"run() needs a prompted task; task {task.data.idx} has no prompt")
        await conversation.turn()
        return await conversation.close()

    @contextlib.asynccontextmanager
    async def interaction(
        self, task: Any, *, runtime: Any = None, tools: Any = None, **_: Any
    ) -> AsyncIterator["_Conversation"]:
        _check_no_resources(runtime, tools)
        conversation = self.episode.open(task, self.name, self.config, interactive=True)
        await conversation.setup()
        failed = False
        try:
            yield conversation
        except BaseException:
            failed = True
            raise
        finally:
            if not failed:
                await conversation.close()


class _UnplayedSeat:
    """Another seat: it needs a model of its own, which this adapter does not serve."""

    def __init__(self, name: str, policy_seat: str):
        self.name, self.policy_seat = name, policy_seat
        self.trainable = False

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise VerifiersError(
            f"the environment's run() uses the seat {self.name!r}; VerifiersEnv plays one seat, "
            f"{self.policy_seat!r}, with the policy, and serves no model for the others"
        )

    run = interaction = _refuse


def _check_no_resources(runtime: Any, tools: Any) -> None:
    if runtime is not None or tools:
        raise VerifiersError("a borrowed runtime or tool servers are not supported by VerifiersEnv")


class _Conversation:
    """The seat's exchange, as verifiers' ``Interaction``: ``turn()`` sends a user turn and returns the model's
    answer as a ``Segment``; ``trace`` is a verifiers ``Trace`` of the messages, scored by the task on close."""

    def __init__(self, episode: _Episode, task: Any, seat: str, config: Any, interactive: bool):

        self.episode, self.task, self.interactive = episode, task, interactive
        self.trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=config, name=seat),
        )
        self.stops = task.hooks("stop")  # on the trace: `LoadedEnvironment` refuses the others when it loads
        self.limit = min(config.max_turns or math.inf, episode.runner_max_turns)
        opening, self.prompted = opening_messages(task.data)
        self._add([_typed(m) for m in opening])
        self._unseen: Messages = list(opening)  # messages the policy has not been shown yet
        self.turns = 0
        self.started = self.over = self.ended = self.closed = False

    def _add(self, messages: List[Any], sampled: bool = False) -> None:

        for message in messages:
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
            self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))

    async def setup(self) -> None:

        if type(self.task).setup is not vf.Task.setup:  # no sandbox here: runtime is None
            await self.task.setup(self.trace, None)

    async def turn(self, message: Any = None) -> Any:

        if self.closed:
            raise RuntimeError("this interaction is closed")
        if self.ended:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if self.over or self.turns >= self.limit:  # verifiers' limits refuse the next turn, not the last answer
            if not self.over:
                self.trace.stop("max_turns")
            self.ended = True
            return Segment(messages=[], terminated=True)
        prompted = not self.started and self.prompted
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        self.started = True
        if message is not None:
            typed = [vf.UserMessage(content=message)] if isinstance(message, str) else [_typed(m) for m in message]
            self._add(typed)
            self._unseen += messages_from_verifiers(typed)
        unseen, self._unseen = self._unseen, []
        reply = vf.AssistantMessage(content=await self.episode.ask(unseen))
        self._add([reply], sampled=True)
        self.turns += 1
        for stop in self.stops:
            fired = await call_hook(stop, {vf.Trace: self.trace})
            if not isinstance(fired, bool):
                raise VerifiersError(f"@stop {stop.__name__} must return bool, got {type(fired).__name__}")
            if fired:
                self.trace.stop(stop.__name__)
                self.over = True
                break
        return Segment(messages=[reply])

    async def close(self) -> Any:
        """End the exchange: the task's finalize hook (if it has one) and scoring; idempotent."""

        if self.closed:
            return self.trace
        self.closed = True
        if self.trace.stop_condition is None:
            self.trace.stop("user_closed" if self.interactive else "agent_completed")
        if type(self.task).finalize is not vf.Task.finalize:
            await self.task.finalize(self.trace, None)
        try:
            await self.task.score(self.trace)
        except Exception as e:
            raise VerifiersError(
                f"{self.episode.loaded.env_id!r}, task {self.task.data.idx}: {e} (the task's @vf.reward and @vf.metric "
                "functions raised; the traceback above names the function)"
            ) from e
        self.trace.is_completed = self.trace.ok = True
        self.episode.traces.append(self.trace)
        return self.trace


def _typed(message: Any) -> Any:
    """A message dict (``{"role", "content"}``) as verifiers' typed message."""
    if not isinstance(message, Mapping):
        return message
    return parse_message(dict(message))
