"""A mistake in the config ends a script with its one-line message, not a traceback through Tune's internals.

A `ConfigError` (`rllib_p3o.core.config_error`: a setting, a file, a model, the cluster's size) is raised where the
mistake is found. In a ``tune.Tuner(...).fit()`` script that is Tune's driver loop: Tune asks the trainable for its
resources before it starts a trial, and P3O validates the trial's config there, on the driver (`P3O.
default_resource_request`), so that no trial starts with it. Python would print some 40 frames of Tune's before the
message. `show_config_errors_as_one_line` wraps ``sys.excepthook`` so that an uncaught `ConfigError` (or an error
caused by one) is printed as ``ConfigError: <message>``; the exit status stays 1. Other errors keep their traceback,
and ``RLLIB_P3O_VERBOSE=1`` shows the traceback of these too.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Optional, Type

from rllib_p3o.core import quiet
from rllib_p3o.core.config_error import ConfigError


def config_error_in(error: Optional[BaseException]) -> Optional[ConfigError]:
    """``error`` itself if it is a `ConfigError`, else the first one among its causes (``raise ... from``), else
    None. Not its context: an error raised while one was being handled is a problem of its own."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ConfigError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def one_line(error: ConfigError) -> str:
    """How an uncaught `ConfigError` is shown: its type and its message."""
    return f"{type(error).__name__}: {error}"


class _OneLineConfigErrors:
    """``sys.excepthook``: a `ConfigError` (or an error it caused) as `one_line`, anything else to ``previous``."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, kind: Type[BaseException], error: BaseException, traceback: Optional[TracebackType]) -> None:
        mistake = config_error_in(error)
        if mistake is None or quiet.verbose():
            self.previous(kind, error, traceback)
            return
        print(one_line(mistake), file=sys.stderr, flush=True)


def show_config_errors_as_one_line() -> None:
    """Install `_OneLineConfigErrors` as ``sys.excepthook`` (idempotent; the hook it replaces handles the rest)."""
    if not isinstance(sys.excepthook, _OneLineConfigErrors):
        sys.excepthook = _OneLineConfigErrors(sys.excepthook)
