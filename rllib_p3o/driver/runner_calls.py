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

A runner that fails to start (an exception in its constructor, or a config it cannot unpickle) is neither: it is a
configuration error, and `EngineRunners.raise_start_failure` raises it on the driver as it happened, whatever the
fault-tolerance settings (RLlib would log it and go on to fail elsewhere, e.g. with an IndexError in ``get_spaces``).
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple, TypeVar

import ray
from ray.exceptions import RayActorError, RayError, RaySystemError, RayTaskError
from ray.rllib.env.env_runner_group import EnvRunnerGroup

from rllib_p3o.core.callables import CallableImportError, make_importable_hint

if TYPE_CHECKING:
    from rllib_p3o.runner.env_runner import VLLMEnvRunner

T = TypeVar("T")
# A call on one runner: a function of the runner, such as ``VLLMEnvRunner.pad_token_id`` or
# ``lambda runner: runner.sample(groups=groups)`` (typed, so that jump-to-definition and type checkers follow it).
RunnerCall = Callable[["VLLMEnvRunner"], T]

LOCAL_ID = 0


class EnvRunnerFailedError(RuntimeError):
    """A runner died and the fault-tolerance settings say not to go on without it."""


class EnvRunnerStartError(RuntimeError):
    """A runner failed to start, and its own exception cannot be raised on the driver as it is."""


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

    def raise_start_failure(self, env_config: Optional[Mapping[str, Any]] = None) -> None:
        """Wait until every remote runner has started, and raise what one raised if it could not: its own exception
        (type and message), with the runner's id and traceback in a note. A config the runner could not unpickle
        (a function or class of a module the runner cannot import) raises `CallableImportError` naming the module,
        the ``env_config`` entries defined in it and how to make it importable. Runners that died otherwise (killed,
        node lost) are left to RLlib's fault tolerance."""
        if not self.remote:
            return
        ids = list(range(1, self.group.num_remote_env_runners() + 1))  # RLlib numbers remote runners from 1
        refs = self.group.foreach_env_runner(
            lambda runner: None, remote_worker_ids=ids, local_env_runner=False, healthy_only=False, return_obj_refs=True
        )
        for runner_id, ref in zip(ids, refs):
            try:
                ray.get(ref)
            except RayActorError as e:
                cause = e.args[0] if e.args else None
                if e.actor_init_failed and isinstance(cause, RayTaskError):
                    raise _start_error(runner_id, cause, env_config or {}) from None

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

    def max_in_flight(self) -> int:
        """How many calls of one tag a runner may have in flight (RLlib's ``max_requests_in_flight_per_env_runner``);
        `start` skips a call beyond it."""
        return int(getattr(self.group._remote_config, "max_requests_in_flight_per_env_runner", 1) or 1)

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


def _start_error(runner_id: int, error: RayTaskError, env_config: Mapping[str, Any]) -> BaseException:
    """The exception to raise for runner ``runner_id``'s failed start (`EngineRunners.raise_start_failure`)."""
    cause = error.cause
    where = f"(raised in EnvRunner {runner_id} while it started; its traceback:)\n{error.traceback_str}"
    if isinstance(cause, RaySystemError) and isinstance(getattr(cause, "client_exc", None), ImportError):
        missing = cause.client_exc.name or str(cause.client_exc)
        users = _entries_from_module(env_config, missing)
        error = CallableImportError(
            f"EnvRunner {runner_id} could not start: it cannot import module {missing!r}, needed to unpickle its "
            f"config ({type(cause.client_exc).__name__}: {cause.client_exc})"
            + (f"; defined there: {', '.join(users)}" if users else "")
            + ". Functions and classes of an importable module travel by reference (only functions of the "
            "script you run, __main__, travel by value). " + make_importable_hint(missing),
            name=missing,
        )
        error.add_note(where)
        return error
    if isinstance(cause, BaseException) and not isinstance(cause, RayError):
        cause.add_note(where)
        return cause
    return EnvRunnerStartError(f"EnvRunner {runner_id} could not start: {error}")


def _entries_from_module(env_config: Mapping[str, Any], module: str) -> List[str]:
    """The ``env_config`` entries (and the items of dict entries, such as ``tools``) defined in ``module``."""
    found = []
    for key, value in env_config.items():
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for name, item in items:
            defined_in = getattr(item, "__module__", None) or ""
            if defined_in == module or defined_in.startswith(module + "."):
                label = f"env_config[{key!r}]" + (f"[{name!r}]" if name is not None else "")
                found.append(f"{label} ({defined_in}.{getattr(item, '__qualname__', repr(item))})")
    return found
