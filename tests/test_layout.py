"""The package's shape, read from the sources (nothing is imported; function-level and TYPE_CHECKING imports count).

The rooms, bottom to top: ``core/`` (every process) < ``reward_models/`` (both sides of reward-model serving) <
``data/`` < ``sync/`` (both ends of a weight sync) < ``runner/`` and ``learner/`` (their actors; neither imports the
other) < ``envs/`` (adapters of other projects' environments, built on the runners' environment API) < ``driver/`` <
the top level (``p3o.py``, the algorithm that assembles them, and ``cli/``, ``sweep/``, ``tasks/``). The rules:
- imports only go downward, never up and never sideways between rooms of the same rank, and form no cycle;
- code that runs in the EnvRunner and Learner actors never reaches a driver module, even indirectly;
- a module that both the driver and the runners import lives in a shared room (``core/``, ``data/``, ``sync/``);
- the top level stays a few modules beside the rooms.
"""

import ast
import pathlib
import sys
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rllib_p3o"
# Room -> rank: a module may import its own room and the rooms of lower rank. Everything else is the top level.
ROOM_RANKS = {
    "core": 0,
    "reward_models": 1,
    "data": 2,
    "sync": 3,
    "runner": 4,
    "learner": 4,
    "envs": 5,
    "driver": 6,
}
TOP = "top"
TOP_RANK = 7
# Rooms whose modules both the driver and the runners may import.
SHARED_ROOMS = ("core", "reward_models", "data", "sync", "envs")
# Modules that only the driver (or a Tune trial actor) runs: actor code must not import them, even indirectly.
DRIVER_ONLY_PREFIXES = (
    "rllib_p3o.p3o",
    "rllib_p3o.driver",
    "rllib_p3o.reward_models.actors",
    "rllib_p3o.cli",
    "rllib_p3o.sweep",
)
MAX_TOP_LEVEL_MODULES = 4


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
    assert "rllib_p3o.core.losses.parts" in graph["rllib_p3o.core.losses.grpo"]  # the graph sees the package's modules
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


def room(module: str) -> str:
    """The room of a package module (``rllib_p3o.driver.sampler`` -> ``driver``), or `TOP`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOM_RANKS else TOP


def rank(module: str) -> int:
    return ROOM_RANKS.get(room(module), TOP_RANK)


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    """``a -> b`` for each import of a higher room, or of another room of the same rank."""
    return [
        f"{a} -> {b}"
        for a, deps in sorted(graph.items())
        for b in sorted(deps)
        if rank(b) > rank(a) or (rank(b) == rank(a) and room(a) != room(b) and room(a) != TOP)
    ]


def test_upward_imports_are_found():
    graph = {"rllib_p3o.core.a": {"rllib_p3o.driver.b"}, "rllib_p3o.runner.c": {"rllib_p3o.learner.d"}}
    graph.update({"rllib_p3o.driver.b": {"rllib_p3o.core.a"}, "rllib_p3o.learner.d": set()})
    assert upward_imports(graph) == [
        "rllib_p3o.core.a -> rllib_p3o.driver.b",
        "rllib_p3o.runner.c -> rllib_p3o.learner.d",
    ]


def test_no_import_runs_upward():
    graph = import_graph()
    assert {"core", "reward_models", "data", "sync", "runner", "learner", "envs", "driver"} <= {room(m) for m in graph}
    assert upward_imports(graph) == []


def test_actor_code_never_imports_driver_only_modules():
    graph = import_graph()
    # The runners' and learners' own code, the environments runners build, and the reward-model actors.
    actor_modules = [m for m in graph if room(m) in ("runner", "learner", "envs")] + ["rllib_p3o.reward_models.server"]
    assert "rllib_p3o.runner.env_runner" in actor_modules and "rllib_p3o.learner.p3o_torch_learner" in actor_modules
    offending = {m: sorted(d for d in reachable(graph, m) if d.startswith(DRIVER_ONLY_PREFIXES)) for m in actor_modules}
    assert {m: d for m, d in offending.items() if d} == {}


def test_what_driver_and_runners_both_import_lives_in_a_shared_room():
    graph = import_graph()
    importers: Dict[str, Set[str]] = {}
    for module, deps in graph.items():
        for dep in deps:
            importers.setdefault(dep, set()).add(room(module))
    shared = {m for m, rooms in importers.items() if {"driver", "runner"} <= rooms}
    assert "rllib_p3o.data.episodes" in shared  # the episode format: built by the runners, read by the driver
    assert {m for m in shared if room(m) not in SHARED_ROOMS} == set()


def test_reachable_sees_indirect_imports():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}


def test_the_top_level_is_a_few_modules_beside_the_sub_packages():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    for sub in ROOM_RANKS:
        assert (PACKAGE / sub / "__init__.py").exists(), sub
