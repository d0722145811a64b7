"""The EnvRunners that hold vLLM engines, and how the driver calls them.

With remote runners, those are the engine runners; the driver's local runner holds no engine (the driver, or Tune's
trial actor, never pays for one). Without remote runners (``num_env_runners=0``) the local runner is the only one.
RLlib's `EnvRunnerGroup` only logs a failed runner call; the calls here raise, because a runner that missed a
weight sync would go on sampling with old weights.
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from ray.rllib.env.env_runner_group import EnvRunnerGroup


class EngineRunners:
    """Calls on the engine runners of an `EnvRunnerGroup` (see the module docstring)."""

    def __init__(self, env_runner_group: EnvRunnerGroup):
        self.group = env_runner_group

    @property
    def remote(self) -> bool:
        """Whether the engines live in remote runners (else in the local one)."""
        return self.group.num_remote_env_runners() > 0

    def foreach(self, fn: Callable[[Any], Any]) -> List[Any]:
        """``fn(runner)`` on every engine runner, blocking; raises if any runner failed."""
        if not self.remote:
            return [fn(self.group.local_env_runner)]
        expected = self.group.num_remote_env_runners()
        results = self.group.foreach_env_runner(fn, local_env_runner=False)
        if len(results) != expected or self.group.num_healthy_remote_workers() < expected:
            raise RuntimeError(f"{expected - len(results)} of {expected} EnvRunners failed; see the actor errors "
                               "above (engine start-up, weight sync or reward function).")
        return results

    def call_first(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``runner.method(*args, **kwargs)`` on the first engine runner (remote if any, else the local one)."""
        if self.remote:
            return self.group.foreach_env_runner(
                lambda r: getattr(r, method)(*args, **kwargs), remote_worker_ids=[1], local_env_runner=False)[0]
        return getattr(self.group.local_env_runner, method)(*args, **kwargs)

    def foreach_async(self, fn: Callable[[Any], Any], tag: str) -> None:
        """Start ``fn(runner)`` on every remote runner without waiting. A runner that still has a ``tag`` call in
        flight gets no new one (RLlib's in-flight limit per runner and tag, ``max_requests_in_flight_per_env_runner``,
        1 by default): the new call is skipped, not queued."""
        self.group.foreach_env_runner_async(fn, tag=tag)

    def fetch_ready(self, tag: str, timeout_s: float) -> List[Tuple[int, Any]]:
        """``(runner id, result)`` of the ``tag`` calls that finished within ``timeout_s``. Errors of those calls are
        raised (or ignored) as RLlib's fault-tolerance settings say."""
        return list(self.group.fetch_ready_async_reqs(tags=tag, timeout_seconds=timeout_s))
