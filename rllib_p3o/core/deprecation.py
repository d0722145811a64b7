"""Deprecations that speak: a renamed setting or a moved module warns once, naming its replacement and the release
that removes it (`rllib_p3o.core.settings.REMOVAL_VERSION`), as RLlib's ``deprecation_warning(old=, new=)`` does."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Mapping, Set

REMOVAL_VERSION = "0.4"

_warned: Set[str] = set()


def warn_once(old: str, new: str, *, stacklevel: int = 3) -> None:
    """One DeprecationWarning per process for ``old``: "``old`` is deprecated; use ``new`` (removed in 0.4)".
    ``stacklevel`` points the warning at the user's line (Python shows DeprecationWarnings raised from ``__main__``)."""
    if old in _warned:
        return
    _warned.add(old)
    warnings.warn(
        f"{old} is deprecated and will be removed in rllib-p3o {REMOVAL_VERSION}; use {new} instead.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_attribute(module: str, name: str, moved: Mapping[str, str]) -> Any:
    """A module's ``__getattr__`` (PEP 562) for names that moved elsewhere: the object from its new module, with a
    warning naming it; AttributeError for any other name."""
    if name not in moved:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_once(f"{module}.{name}", f"{moved[name]}.{name}", stacklevel=4)  # the importing line, past __getattr__
    return getattr(importlib.import_module(moved[name]), name)
