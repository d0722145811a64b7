"""Configuration values the pages state, read from the committed source (no import: the check loads no Ray, no
torch): a function's keyword defaults."""

from __future__ import annotations

import ast
import os
from typing import Any, Dict


def defaults(root: str, path: str, function: str) -> Dict[str, Any]:
    """The literal defaults of ``function``'s parameters in the module at ``path`` (relative to ``root``)."""
    with open(os.path.join(root, path)) as f:
        tree = ast.parse(f.read())
    node = next(
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function
    )
    a = node.args
    positional = a.posonlyargs + a.args
    pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults))
    pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    out = {}
    for arg, default in pairs:
        try:
            out[arg.arg] = ast.literal_eval(default)
        except ValueError:
            continue  # not a literal (a call, a name)
    return out
