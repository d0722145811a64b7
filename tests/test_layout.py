"""The package's shape: imports only go downward (no cycle, function-level and TYPE_CHECKING imports included), the
code that runs in EnvRunner actors (`rllib_p3o/runner/`) never reaches the driver's modules, and the top level stays
small (the rest lives in sub-packages named after the process that runs it). Reads the sources; imports nothing."""

import ast
import pathlib
import sys
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rllib_p3o"
# Modules that only the driver (or a Tune trial actor) runs: runner code must not import them, even indirectly.
DRIVER_ONLY_PREFIXES = (
    "rllib_p3o.p3o",
    "rllib_p3o.sampler",
    "rllib_p3o.engine_runners",
    "rllib_p3o.trial_reuse",
    "rllib_p3o.cli",
    "rllib_p3o.progress",
    "rllib_p3o.preflight",
    "rllib_p3o.sync.push",
    "rllib_p3o.sweep",
)
MAX_TOP_LEVEL_MODULES = 10


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
                return path[path.index(dep) :] + [dep]
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
    assert "rllib_p3o.core.objectives" in graph["rllib_p3o.core.losses.grpo"]  # the graph sees the package's modules
    assert find_cycle(graph) == []


def reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: Set[str] = set()
    todo = [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_runner_code_never_imports_driver_only_modules():
    graph = import_graph()
    runner_modules = [m for m in graph if m.startswith("rllib_p3o.runner.")]
    assert "rllib_p3o.runner.env_runner" in runner_modules
    offending = {
        m: sorted(d for d in reachable(graph, m) if d.startswith(DRIVER_ONLY_PREFIXES)) for m in runner_modules
    }
    assert {m: d for m, d in offending.items() if d} == {}


def test_reachable_sees_indirect_imports():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}


def test_the_top_level_is_a_few_modules_beside_the_sub_packages():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    for sub in ("core", "runner", "learner", "sync", "data"):
        assert (PACKAGE / sub / "__init__.py").exists(), sub
