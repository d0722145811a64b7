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
        "rllib_p3o.sampler": ["Sampler", "OnlineSource"],
        "rllib_p3o.engine_runners": ["EngineRunners", "EnvRunnerFailedError"],
        "rllib_p3o.trial_reuse": ["RESETTABLE_KEYS", "config_differences"],
        "rllib_p3o.preflight": ["check_cluster_fits", "ClusterTooSmallError"],
        "rllib_p3o.progress": ["IterationPrinter", "quiet_library_output", "plot_training_curves"],
        "rllib_p3o.driver.progress": ["silence_driver_and_workers", "quiet_library_output"],
        "rllib_p3o.sync.push": ["WeightSync", "LearnerProbes"],
        "rllib_p3o.runner.episodes": ["completion_episode", "episodes_to_records"],
        "rllib_p3o.data.batch_source": ["BatchSource", "SourceBatch", "OfflineSource"],
        "rllib_p3o.driver.sampler": ["OnlineSource"],
    }.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
    from rllib_p3o import metrics
    from rllib_p3o.core import metrics as moved

    assert metrics is moved  # the same module object, not a copy


def test_old_module_paths_and_names_warn_once_with_the_new_path_and_the_removal_version():
    """In a fresh interpreter (a module imported once warns once): each old path names its new one and 0.4."""
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "import rllib_p3o\n"
        "from rllib_p3o.sampler import Sampler\n"
        "from rllib_p3o.progress import IterationPrinter\n"
        "from rllib_p3o.sync.push import WeightSync\n"
        "from rllib_p3o.runner.episodes import episodes_to_records\n"
        "from rllib_p3o.runner.env import DatasetError, TextEnv\n"
        "from rllib_p3o.data.batch_source import BatchSource\n"
        "from rllib_p3o.driver.sampler import OnlineSource\n"
        "from rllib_p3o.driver.progress import quiet_library_output, silence_driver_and_workers\n"
        "assert quiet_library_output is silence_driver_and_workers\n"
        "from rllib_p3o.sampler import Sampler\n"  # the second time: silent
        "import rllib_p3o.driver.sampler, rllib_p3o.data.episodes, rllib_p3o.data.datasets\n"
        "assert Sampler is rllib_p3o.driver.sampler.Sampler\n"
        "assert episodes_to_records is rllib_p3o.data.episodes.episodes_to_records\n"
        "assert DatasetError is rllib_p3o.data.datasets.DatasetError\n"
        "import rllib_p3o.driver.batch_sources as sources\n"
        "assert BatchSource is sources.BatchSource and OnlineSource is sources.OnlineSource\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "DeprecationWarning" in line]
    for old, new in [
        ("rllib_p3o.sampler", "rllib_p3o.driver.sampler"),
        ("rllib_p3o.progress", "rllib_p3o.driver.progress"),
        ("rllib_p3o.sync.push", "rllib_p3o.driver.weight_sync"),
        ("rllib_p3o.runner.episodes", "rllib_p3o.data.episodes"),
        ("rllib_p3o.runner.env.DatasetError", "rllib_p3o.data.datasets.DatasetError"),
        ("rllib_p3o.data.batch_source", "rllib_p3o.driver.batch_sources"),
        ("rllib_p3o.driver.sampler.OnlineSource", "rllib_p3o.driver.batch_sources.OnlineSource"),
        ("rllib_p3o.driver.progress.quiet_library_output", "rllib_p3o.driver.progress.silence_driver_and_workers"),
    ]:
        assert [w for w in warned if f" {old} is deprecated" in w and f"use {new} instead" in w and "0.4" in w], old
    assert sum(" rllib_p3o.sampler is deprecated" in w for w in warned) == 1
    assert all("<string>" in w for w in warned), warned  # pointed at the importing line, not at the package


def test_every_public_name_the_readme_imports_still_imports():
    readme = _read("README.md")
    imports = re.findall(r"^from (rllib_p3o[\w.]*) import ([\w, ]+)$", readme, flags=re.M)
    assert len(imports) >= 3
    for module, names in imports:
        mod = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(mod, name.strip()), f"{module}.{name.strip()}"
