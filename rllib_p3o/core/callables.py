"""User callables named in a config: a function or class given as itself or as ``"package.module:name"``, imported
in the process that needs it (often a runner), with errors that say how to make it importable there."""

from __future__ import annotations

import functools
import importlib
import os
import re
import socket
from typing import Callable, Union

# "package.module:name", as the configs write a callable by name.
BY_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class CallableImportError(ImportError):
    """A function or class that the config names (``"module:function"``, or pickled by reference to its module) cannot
    be imported in the process that needs it, typically a runner process; the message says how to make it
    importable there."""


def make_importable_hint(module: str) -> str:
    """How to make ``module`` importable in Ray's worker processes (for `CallableImportError` messages)."""
    top = module.split(".")[0]
    return (
        f"Runner processes import {module!r} by name, so it must be importable on every node: install it, put its "
        f'folder on PYTHONPATH before Ray starts, or let Ray ship it: ray.init(runtime_env={{"py_modules": [{top}]}}) '
        f'(the imported module, or its folder\'s path), or ray.init(runtime_env={{"working_dir": "."}}) for the '
        "folder you run from."
    )


def resolve_callable(fn: Union[str, Callable], what: str = "reward_fn") -> Callable:
    """A callable, or ``"package.module:function"`` imported by name (handy in Tune/CLI configs); ``what`` names the
    setting in errors. `CallableImportError` when the module or the name cannot be imported here."""
    if callable(fn):
        return fn
    if isinstance(fn, str) and ":" in fn:
        module, attr = fn.split(":", 1)
        where = f"in this process (pid {os.getpid()} on {socket.gethostname()})"
        try:
            imported = importlib.import_module(module)
        except ImportError as e:
            raise CallableImportError(
                f"env_config[{what!r}] = {fn!r}: cannot import module {module!r} {where}: {type(e).__name__}: {e}. "
                + make_importable_hint(module),
                name=module,
            ) from e
        try:
            return functools.reduce(getattr, attr.split("."), imported)
        except AttributeError:
            raise CallableImportError(
                f"env_config[{what!r}] = {fn!r}: module {module!r} ({getattr(imported, '__file__', '?')}) has no "
                f"attribute {attr!r} {where}.",
                name=module,
            ) from None
    raise ValueError(f"{what} must be a callable or 'module:function', got {fn!r}")


def function_name(fn: Callable) -> str:
    """A reward function's name in metrics and tables, as TRL names it: ``__name__`` (through ``functools.partial``),
    else the class name of a callable object."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__
