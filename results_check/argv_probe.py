"""Parse command lines with each script's own argparse parser, without running the script: the results check's
command test (`tests/test_results_commands.py`) uses it to check that a page's command has only flags the script
knows and writes the file the page cites.

    echo '[["benchmarks/soak.py", ["--iterations", "10"]]]' | python -m results_check.argv_probe

Reads ``[[script, argv], ...]`` as JSON on stdin; prints, per command, ``{"namespace": {...}, "outputs": [...]}`` or
``{"error": "..."}`` as JSON. The script runs as ``__main__`` up to its ``parse_args`` call, which parses ``argv``
and stops it there: its imports run, nothing else. A script whose output path depends on more than one flag
defines ``output_path(args) -> str``; otherwise its outputs are the values of the flags in `OUTPUT_FLAGS`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from typing import Any, Dict, List

OUTPUT_FLAGS = ("out", "json", "plot", "report", "table")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Parsed(BaseException):
    """Stops the script right after its arguments are parsed."""


def probe(script: str, argv: List[str]) -> Dict[str, Any]:
    """``script``'s own parser applied to ``argv``: its namespace and output paths (relative to the repository when
    inside it), or the parser's error."""
    real = argparse.ArgumentParser.parse_args
    result: Dict[str, Any] = {}

    def parse_args(self, args=None, namespace=None):
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                ns = real(self, argv, namespace)
        except SystemExit:
            result["error"] = stderr.getvalue().strip().splitlines()[-1]
            raise _Parsed
        script_globals = sys._getframe(1).f_globals
        if "output_path" in script_globals:
            outputs = [script_globals["output_path"](ns)]
        else:
            outputs = [getattr(ns, f) for f in OUTPUT_FLAGS if isinstance(getattr(ns, f, None), str)]
        result["namespace"] = {
            k: v for k, v in vars(ns).items() if v is None or isinstance(v, (str, int, float, bool, list))
        }
        result["outputs"] = [_relative(p) for p in outputs]
        raise _Parsed

    path = os.path.join(ROOT, script)
    argparse.ArgumentParser.parse_args = parse_args
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [path, *argv], [os.path.dirname(path)]
    try:
        runpy.run_path(path, run_name="__main__")
        result.setdefault("error", "the script ended without parsing its arguments")
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = real
        sys.argv, sys.path[:] = saved_argv, saved_path
    return result


def _relative(path: str) -> str:
    full = os.path.normpath(os.path.join(ROOT, path))
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


if __name__ == "__main__":
    os.chdir(ROOT)
    commands = json.load(sys.stdin)
    print(json.dumps([probe(script, argv) for script, argv in commands]))
