"""What the docs promise about the package: the layout page names the modules that exist, the README's links
resolve, and the names users imported from the old (flat) module paths still import from there."""

import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "rllib_p3o")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def test_the_layout_page_names_every_module_and_only_modules_that_exist():
    layout = _read("docs", "layout.md")
    named = set(re.findall(r"\b(\w+\.py)\b", layout))
    package = {
        f for d, _, fs in os.walk(PACKAGE) for f in fs if f.endswith(".py") and f != "__init__.py" and "tasks" not in d
    }
    in_repo = {
        f for d, _, fs in os.walk(ROOT) if not d.startswith(os.path.join(ROOT, ".")) for f in fs if f.endswith(".py")
    }
    assert len(named) > 20
    assert package - named == set(), "modules the layout page does not name"
    assert named - in_repo == set(), "the layout page names files that do not exist"


def test_every_relative_link_of_the_readme_and_contributing_resolves():
    for page in ("README.md", "CONTRIBUTING.md"):
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(page))
        local = [link for link in links if not re.match(r"[a-z]+://", link)]
        assert local or page == "CONTRIBUTING.md"
        missing = [link for link in local if not os.path.exists(os.path.join(ROOT, link))]
        assert missing == [], f"{page}: {missing}"


def test_the_readme_is_a_product_page():
    readme = _read("README.md")
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme
    assert not re.search(r"\b[0-9a-f]{7,40}\b", readme), "a commit hash in the README"


def test_the_public_names_import_and_old_paths_are_gone():
    for module, names in {
        "rllib_p3o": ["P3O", "P3OConfig", "p3o_loss", "grpo_loss", "effective_sample_size"],
        "rllib_p3o.p3o": ["P3O", "P3OConfig"],
        "rllib_p3o.data": ["validate_trajectories", "TrajectoryRecorder", "OfflineDataError"],
        "rllib_p3o.core.losses": ["LOSSES", "get_loss", "register_loss", "OldLogprobs"],
        "rllib_p3o.core.metrics": ["ESS", "HELDOUT_PREFIX"],
        "rllib_p3o.tasks": [
            "ArithmeticTask",
            "arithmetic_reward",
            "build_demo_model",
            "build_tiny_model",
            "CHAT_TOKENS",
            "CHAT_TEMPLATE",
        ],
        "rllib_p3o.driver.interruption": ["exit_unless_finished", "unfinished_trials", "restore_call"],
        "rllib_p3o.core.config_error": ["ConfigError"],
        "rllib_p3o.driver.batch_sources": ["BatchSource", "SourceBatch", "OfflineSource", "OnlineSource"],
        "rllib_p3o.driver.progress": ["IterationPrinter", "silence_driver_and_workers", "plot_training_curves"],
    }.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
    # No compatibility layer at 0.x: the paths of earlier layouts (CHANGELOG, "Moved in 0.2") import nothing.
    for old in ("rllib_p3o.objectives", "rllib_p3o.sampler", "rllib_p3o.core.objectives", "rllib_p3o._moved"):
        try:
            importlib.import_module(old)
        except ModuleNotFoundError:
            continue
        raise AssertionError(f"{old} still imports")
    assert not hasattr(importlib.import_module("rllib_p3o.driver.progress"), "quiet_library_output")
    assert not hasattr(importlib.import_module("rllib_p3o.runner.env"), "DatasetError")


def test_every_public_name_the_readme_imports_still_imports():
    readme = _read("README.md")
    imports = re.findall(r"^from (rllib_p3o[\w.]*) import ([\w, ]+)$", readme, flags=re.M)
    assert len(imports) >= 3
    for module, names in imports:
        mod = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(mod, name.strip()), f"{module}.{name.strip()}"
