"""The package's shape: imports only go downward (no cycle, function-level and TYPE_CHECKING imports included) and
no module is over 350 lines. Reads the sources; imports nothing."""

import ast
import pathlib
import sys
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rllib_p3o"
MAX_LINES = 350


def _modules() -> Dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> Dict[str, Set[str]]:
    """Module -> package modules it imports anywhere in its body (the parent-package import Python adds is left out:
    every submodule has it)."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: `from .x import y` in package p is `from p.x import y`
                    base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0], base]))
                # `from pkg import sub` imports the submodule when there is one, else the package's __init__.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as ``[a, b, ..., a]``, or ``[]``."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_relative_and_function_level_imports_are_seen(tmp_path, monkeypatch):
    pkg = tmp_path / "rllib_p3o"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from rllib_p3o import b\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    graph = import_graph()
    assert graph["rllib_p3o.a"] == {"rllib_p3o.b"} and graph["rllib_p3o.b"] == {"rllib_p3o.a"}
    assert graph["rllib_p3o.sub.c"] == {"rllib_p3o.a"}
    assert find_cycle(graph) == ["rllib_p3o.a", "rllib_p3o.b", "rllib_p3o.a"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "rllib_p3o.p3o_config" in graph["rllib_p3o.p3o"]  # the graph sees the package's modules
    assert find_cycle(graph) == []


def test_no_module_over_350_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}

