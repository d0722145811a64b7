"""Which failed trials the sweep retries: infrastructure failures (an actor or node lost, a keepalive timeout, the
machine out of memory) say nothing about the method, so they must not count as the method's collapse.

A trial that fails with one of these is not written as a trial file (a rerun runs it again); `run_stage` retries it
up to `MAX_INFRA_RETRIES` times within the run and records every such failure apart, in ``<out>/infra_failures.jsonl``
(`record`), which the report counts as its own column. Any other error (a non-finite loss, a bad config, a bug) is a
training failure: written as an errored trial, and counted as a collapse (`rllib_p3o.sweep.report.per_trial`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

# Times one cell is retried within a run after an infrastructure failure, before the stage stops with it missing
# (a rerun of the command tries again).
MAX_INFRA_RETRIES = 2
INFRA_FAILURES = "infra_failures.jsonl"
# Ray's exceptions that mean a process, a node or a connection was lost rather than that the code raised.
INFRA_ERROR_TYPES = (
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "OwnerDiedError",
    "ObjectFetchTimedOutError",
    "GetTimeoutError",
    "OutOfMemoryError",
    "RaySystemError",
)
# The driver's own timeouts on a runner that is alive but late (`rllib_p3o.driver.sampler`,
# `rllib_p3o.driver.weight_sync`): on a machine that other work slows down, they say how busy it was, not what the
# method did.
TIMEOUT_TEXTS = (
    "prompt groups within sample_timeout_s",
    "did not finish loading weights within weight_sync_timeout_s",
)
# The same failures as their text says them, for an error Tune could only keep as a traceback.
INFRA_ERROR_TEXTS = (
    "The actor died unexpectedly",
    "keepalive",
    "Connection closed by peer",
    "node has died",
    "was killed by the memory monitor",
    *TIMEOUT_TEXTS,
    *INFRA_ERROR_TYPES,
)


def _chain(error: BaseException) -> List[BaseException]:
    """``error`` and what caused it: Python's ``__cause__``/``__context__`` and a RayTaskError's ``cause``."""
    seen: List[BaseException] = []
    todo: List[Optional[BaseException]] = [error]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return [e for e in seen if isinstance(e, BaseException)]


def is_infrastructure_failure(error: Any) -> bool:
    """Whether a trial's error (the exception Tune pickled, or its traceback text) is an infrastructure failure:
    one of `INFRA_ERROR_TYPES` anywhere in its cause chain, or (text only) one of `INFRA_ERROR_TEXTS`."""
    if error is None:
        return False
    if isinstance(error, BaseException):
        for e in _chain(error):
            if any(cls.__name__ in INFRA_ERROR_TYPES for cls in type(e).__mro__):
                return True
        # A RayTaskError's cause may be an exception the driver could not rebuild: fall back to its text.
        error = "".join(str(e) for e in _chain(error))
    return any(text in str(error) for text in INFRA_ERROR_TEXTS)


def summary_line(error: Any, limit: int = 300) -> str:
    """The error's last non-empty line (its type and message), cut to ``limit`` characters."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


def record(out: str, stage: str, trial_name: str, error: Any, attempt: int) -> None:
    """Append one infrastructure failure to ``<out>/infra_failures.jsonl``."""
    row = {"time": time.time(), "stage": stage, "trial": trial_name, "attempt": attempt, "error": summary_line(error)}
    with open(os.path.join(out, INFRA_FAILURES), "a") as f:
        f.write(json.dumps(row) + "\n")


def recorded(out: str) -> List[Dict[str, Any]]:
    """Every infrastructure failure recorded under ``out`` (empty when none)."""
    path = os.path.join(out, INFRA_FAILURES)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
