"""The EnvRunners that hold vLLM engines, and how the driver calls them, runner by runner, through faults.

With remote runners, those are the engine runners; the driver's local runner holds no engine (the driver, or Tune's
trial actor, never pays for one). Without remote runners (``num_env_runners=0``) the local runner (id 0) is the
only one.

Two kinds of failure are kept apart, because RLlib's fault tolerance treats every remote error alike (it marks the
runner unhealthy and, with ``restart_failed_env_runners``, restarts it, which would retry a broken reward function
forever):
- an exception raised by our code in the runner (a reward function that raises, a failed weight-sync probe) is
  caught inside the actor, returned as a value and raised again here, with the runner's id and its traceback;
- a dead runner (its process killed, out of memory, node lost) is RLlib's case: with ``restart_failed_env_runners``
  or ``ignore_env_runner_failures`` its calls are left out of the results (the caller redistributes its work) and
  RLlib restarts it between iterations; without either, `EnvRunnerFailedError` names the runner and the cause.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple, TypeVar

from ray.exceptions import RayError
from ray.rllib.env.env_runner_group import EnvRunnerGroup

if TYPE_CHECKING:
    from rllib_p3o.runner.env_runner import VLLMEnvRunner

T = TypeVar("T")
# A call on one runner: a function of the runner, such as ``VLLMEnvRunner.pad_token_id`` or
# ``lambda runner: runner.sample(groups=groups)`` (typed, so that jump-to-definition and type checkers follow it).
RunnerCall = Callable[["VLLMEnvRunner"], T]

LOCAL_ID = 0


class EnvRunnerFailedError(RuntimeError):
    """A runner died and the fault-tolerance settings say not to go on without it."""


class RemoteTraceback(Exception):
    """Where an error raised in a runner came from: the runner's id and its traceback, as the error's cause (the
    error itself travels without its traceback)."""


class _Outcome(NamedTuple):
    """What a guarded call returns from the actor: the runner's id and its result or exception."""

    runner_id: int
    ok: bool
    value: Any  # the result, or the exception
    remote_traceback: str


def _guarded(fn: Callable[[Any], Any]) -> Callable[[Any], _Outcome]:
    def call(runner: Any) -> _Outcome:
        try:
            return _Outcome(runner.worker_index, True, fn(runner), "")
        except Exception as e:  # noqa: BLE001 - handed to the driver, which raises it
            return _Outcome(runner.worker_index, False, e, _traceback_without_message(e))

    return call


def _traceback_without_message(error: BaseException) -> str:
    """The error's traceback (and its causes') without its own closing message line, which the driver prints when
    it raises the error again: the message then shows once."""
    report = traceback.TracebackException.from_exception(error)
    text, message = "".join(report.format()), "".join(report.format_exception_only())
    return text[: -len(message)] if text.endswith(message) else text


def _unwrap(outcome: _Outcome) -> Any:
    if outcome.ok:
        return outcome.value
    try:  # raised, so that its report has the shape Ray's error formatting expects (it drops a report's first frame)
        raise RemoteTraceback(f"in EnvRunner {outcome.runner_id}:\n{outcome.remote_traceback}")
    except RemoteTraceback as where:
        raise outcome.value from where


class EngineRunners:
    """Calls on the engine runners of an `EnvRunnerGroup` (see the module docstring)."""

    def __init__(self, env_runner_group: EnvRunnerGroup):
        self.group = env_runner_group

    @property
    def remote(self) -> bool:
        """Whether the engines live in remote runners (else in the local one)."""
        return self.group.num_remote_env_runners() > 0

    def healthy_ids(self) -> List[int]:
        """The runners that can take calls now (``[0]``, the local runner, without remote ones)."""
        return sorted(self.group.healthy_env_runner_ids()) if self.remote else [LOCAL_ID]

    def num_runners(self) -> int:
        return self.group.num_remote_env_runners() if self.remote else 1

    def call(self, fns: Mapping[int, RunnerCall[T]], timeout_s: Optional[float] = None) -> Dict[int, T]:
        """``fns[i](runner i)`` for each runner id, in parallel; ``{id: result}`` of those that answered.

        Raises what a call raised in its runner. A dead runner, or one that did not answer within ``timeout_s``, is
        left out of the results (a dead one raises `EnvRunnerFailedError` when runner faults are not tolerated).
        """
        if not fns:
            return {}
        if not self.remote:
            return {LOCAL_ID: fns[LOCAL_ID](self.group.local_env_runner)}
        ids = sorted(fns)
        healthy_before = set(self.group.healthy_env_runner_ids())
        try:
            outcomes = self.group.foreach_env_runner(
                [_guarded(fns[i]) for i in ids],
                remote_worker_ids=ids,
                local_env_runner=False,
                timeout_seconds=timeout_s,
            )
        except RayError as e:  # only when dead runners are not tolerated (RLlib raises the first one)
            dead = sorted(healthy_before - set(self.group.healthy_env_runner_ids())) or ids
            raise EnvRunnerFailedError(
                f"EnvRunner {', '.join(map(str, dead))} died: {type(e).__name__}: {e}. Set "
                "config.fault_tolerance(restart_failed_env_runners=True) to restart failed runners and go on."
            ) from e
        return {o.runner_id: _unwrap(o) for o in outcomes}

    def call_first(self, fn: RunnerCall[T]) -> T:
        """``fn(runner)`` on the first healthy engine runner, e.g. ``call_first(VLLMEnvRunner.pad_token_id)``."""
        for i in self.healthy_ids():
            result = self.call({i: fn})
            if i in result:
                return result[i]
        raise EnvRunnerFailedError(f"no healthy EnvRunner to call {getattr(fn, '__qualname__', fn)} on.")

    def start(self, fns: Mapping[int, RunnerCall[Any]], tag: str) -> None:
        """Start ``fns[i](runner i)`` on remote runners without waiting; results come from `fetch_ready`.

        A runner that still has a ``tag`` call in flight gets no new one (RLlib's in-flight limit per runner and tag,
        ``max_requests_in_flight_per_env_runner``, 1 by default): the new call is skipped, not queued.
        """
        for i, fn in fns.items():
            self.group.foreach_env_runner_async(_guarded(fn), tag=tag, remote_worker_ids=[i])

    def fetch_ready(self, tag: str, timeout_s: float) -> List[Tuple[int, Any]]:
        """``(runner id, result)`` of the ``tag`` calls that finished within ``timeout_s``; raises what they raised.
        Calls of runners that died are left out (or raise, when runner faults are not tolerated)."""
        try:
            ready = self.group.fetch_ready_async_reqs(tags=tag, timeout_seconds=timeout_s)
        except RayError as e:
            raise EnvRunnerFailedError(
                f"an EnvRunner died: {type(e).__name__}: {e}. Set config.fault_tolerance("
                "restart_failed_env_runners=True) to restart failed runners and go on."
            ) from e
        return [(o.runner_id, _unwrap(o)) for _, o in ready]
