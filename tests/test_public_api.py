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


def test_old_import_paths_still_work():
    for module, names in {
        "rllib_p3o": ["P3O", "P3OConfig", "p3o_loss", "grpo_loss", "effective_sample_size"],
        "rllib_p3o.p3o": ["P3O", "P3OConfig"],
        "rllib_p3o.p3o_config": ["P3OConfig"],
        "rllib_p3o.offline": ["validate_trajectories", "TrajectoryRecorder", "OfflineDataError"],
        "rllib_p3o.env_runner": ["VLLMEnvRunner", "WeightSyncError"],
        "rllib_p3o.multiturn": ["MultiTurnEnv", "ToolEnv", "TurnResult"],
        "rllib_p3o.losses": ["LOSSES", "get_loss", "register_loss"],
        "rllib_p3o.metrics": ["ESS", "HELDOUT_PREFIX"],
        "rllib_p3o.objectives": ["p3o_loss", "kl_k3"],
        "rllib_p3o.trajectories": ["validate_trajectories"],
        "rllib_p3o.rl_module": ["HFCausalLMRLModule"],
        "rllib_p3o.torch.p3o_torch_learner": ["P3OTorchLearner"],
        "rllib_p3o.tasks": ["ArithmeticTask", "arithmetic_reward", "build_demo_model"],
    }.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
    from rllib_p3o import metrics
    from rllib_p3o.core import metrics as moved

    assert metrics is moved  # the same module object, not a copy
