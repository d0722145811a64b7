"""Library output a user cannot act on, kept off the screen by default in every process of a run.

``import rllib_p3o`` calls `quiet_libraries` in each process that loads the package: the driver, Tune's trial
actor, the EnvRunners and the learners (Ray workers import the package before they unpickle its classes, so before
vLLM, transformers or RLlib speak there). What is hidden: vLLM's and transformers' start-up and loading logs below
ERROR, the Hugging Face and vLLM progress bars, RLlib's and Tune's warnings about themselves (API-stack notices,
deprecations of their own internals, slow-setup hints), Python warnings raised inside those libraries, and two lines
the workers' C++ code prints on every successful run (`SKIP_WORKER_LINES`, dropped where the driver shows the
workers' output).
What stays: every error, rllib-p3o's own warnings, and warnings raised by the user's code. An error is shown once:
the copy of an actor's constructor error that Ray prints from the actor's own output ("Exception raised in creation
task", then its traceback) is dropped where the driver shows the workers' output (`CREATION_ERROR`), since the same
error reaches the driver as the exception it raises (and Tune prints a failed trial's).

``RLLIB_P3O_VERBOSE=1`` in the environment (before Ray starts, so that its workers inherit it) shows all of it again.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import Dict

# The one setting that brings the libraries' output back.
VERBOSE_ENV = "RLLIB_P3O_VERBOSE"

# Environment defaults, read by the libraries when they are imported (and by Ray workers started afterwards, which
# inherit the driver's environment). Set only where the user has not set them.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Tune's newer console output prints an experiment box ("Configuration for experiment", "View detailed results
    # here") even with RunConfig(verbose=0); the classic output prints nothing there.
    "RAY_AIR_NEW_OUTPUT": "0",
}
# Lines of the workers' output that Ray's driver leaves off the screen (Ray's own setting; ignored with
# RAY_DEDUP_LOGS=0). Both come from C++, below any Python logger or warning filter, once per run: Ray's notice that
# an actor with max_restarts > 0 (RLlib's EnvRunners, Ray Data's actors) has constructor arguments in the object
# store (ray-project/ray#53727: RLlib holds its reference to them for the runners' lifetime), and torch's note from
# vLLM's CPU worker that it binds memory to a NUMA node.
SKIP_WORKER_LINES_ENV = "RAY_DEDUP_LOGS_SKIP_REGEX"
SKIP_WORKER_LINES = (
    r"has constructor arguments in the object store and max_restarts > 0|NUMA binding: Using MEMBIND policy"
)
QUIET_ENV[SKIP_WORKER_LINES_ENV] = SKIP_WORKER_LINES
# The first line of the copy of an actor's constructor error that Ray's worker prints to its own output; the lines
# after it (the traceback) come from the same worker, which dies with it.
CREATION_ERROR = "Exception raised in creation task:"
# Ray's notice, on every local ray.init(), that it turned token authentication on by itself: nothing to act on (the
# notice that authentication is off, a risk, still shows).
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_AUTH_ENABLED = "Token authentication is enabled"
# Loggers held at ERROR, each unless the user set the environment variable named beside it to another level. (vLLM
# and transformers read theirs at import; these levels matter where they were imported before us.) "ray.rllib" by
# name: RLlib gives that logger a level of its own, from the config's ``log_level``, which P3OConfig defaults to
# ERROR for the same reason.
QUIET_LOGGERS = {
    "vllm": "VLLM_LOGGING_LEVEL",
    "transformers": "TRANSFORMERS_VERBOSITY",
    "ray.rllib": None,
    # Ray's deprecation notices: RLlib's RLModule warns about its own internals in every process that builds one.
    "ray._common.deprecation": None,
    "ray.tune": None,
    "ray.train": None,
    "ray.data": None,
    "torch": None,
    "peft": None,
}
# Python warnings raised inside these packages (DeprecationWarning, FutureWarning, UserWarning) are ignored.
QUIET_WARNING_MODULES = r"(vllm|transformers|torch|ray|peft|huggingface_hub|gymnasium|pyarrow)(\.|$)"


def verbose() -> bool:
    """Whether ``RLLIB_P3O_VERBOSE`` asks for the libraries' full output."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def quiet_libraries() -> Dict[str, str]:
    """Hide the libraries' chatter below ERROR in this process (see the module docstring), unless `verbose`.

    Returns the environment defaults it applies (empty when verbose), for Ray workers started with a
    ``runtime_env`` of their own. Idempotent; only levels below ERROR are hidden.
    """
    if verbose():
        return {}
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module=QUIET_WARNING_MODULES)
    token_auth = logging.getLogger(TOKEN_AUTH_LOGGER)
    if not any(isinstance(f, _DropTokenAuthEnabled) for f in token_auth.filters):
        token_auth.addFilter(_DropTokenAuthEnabled())
    for name, env in QUIET_LOGGERS.items():
        if env is None or os.environ[env].upper() == QUIET_ENV[env].upper():
            logging.getLogger(name).setLevel(logging.ERROR)
    _skip_worker_lines()
    _drop_creation_error_copies()
    if "transformers" in sys.modules:  # imported before us: its progress bars read the environment at import
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    return dict(QUIET_ENV)


def _skip_worker_lines() -> None:
    """`SKIP_WORKER_LINES` where Ray was imported before us: its driver read ``RAY_DEDUP_LOGS_SKIP_REGEX`` at import
    (``import ray`` first, as scripts do). Not where the user set that variable to a pattern of their own."""
    if os.environ.get(SKIP_WORKER_LINES_ENV) != SKIP_WORKER_LINES or "ray._private.ray_logging" not in sys.modules:
        return
    from ray._private import ray_logging

    for deduplicator in (ray_logging.stdout_deduplicator, ray_logging.stderr_deduplicator):
        if getattr(deduplicator, "skip_re", False) is None:
            deduplicator.skip_re = re.compile(SKIP_WORKER_LINES)


def _drop_creation_error_copies() -> None:
    """Wrap the driver's printers of the workers' output (Ray's deduplicators, where Ray is imported) with
    `_WithoutCreationErrors`. Idempotent."""
    if "ray._private.ray_logging" not in sys.modules:
        return
    from ray._private import ray_logging

    for deduplicator in (ray_logging.stdout_deduplicator, ray_logging.stderr_deduplicator):
        if not isinstance(deduplicator.deduplicate, _WithoutCreationErrors):
            deduplicator.deduplicate = _WithoutCreationErrors(deduplicator.deduplicate)


class _WithoutCreationErrors:
    """A deduplicator's ``deduplicate(batch)`` that first drops a worker's `CREATION_ERROR` line and every later line
    of that worker (its traceback; the worker dies with the error)."""

    def __init__(self, deduplicate):
        self._deduplicate = deduplicate
        self._failed_workers = set()

    def __call__(self, batch):
        source = (batch.get("ip"), batch.get("pid"))
        lines = batch.get("lines") or []
        if source not in self._failed_workers:
            first = next((i for i, line in enumerate(lines) if CREATION_ERROR in line), None)
            if first is None:
                return self._deduplicate(batch)
            self._failed_workers.add(source)
            lines = lines[:first]
        else:
            lines = []
        return self._deduplicate({**batch, "lines": lines})


class _DropTokenAuthEnabled(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster" notice (`TOKEN_AUTH_LOGGER`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TOKEN_AUTH_ENABLED)
