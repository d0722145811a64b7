"""What the README promises about the package: its layout section lists the modules that exist, and the names users
imported before the module split (issue 9) still import from the same places."""

import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def test_readme_layout_matches_the_tree_and_old_import_paths_still_work():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    listed = re.findall(r"^  ([\w/]+\.py)", layout, flags=re.M)
    assert len(listed) > 15
    for path in listed:
        assert os.path.exists(os.path.join(ROOT, "rllib_p3o", path)), path
    on_disk = {os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "rllib_p3o"))
               for d, _, fs in os.walk(os.path.join(ROOT, "rllib_p3o")) for f in fs
               if f.endswith(".py") and f != "__init__.py" and "tasks" not in d}
    assert on_disk <= set(listed) | {"offline.py", "cli.py", "progress.py"}, on_disk - set(listed)
    # Names users imported before the split (issue 9) still import from there.
    for module, names in {"rllib_p3o": ["P3O", "P3OConfig", "p3o_loss", "grpo_loss", "effective_sample_size"],
                          "rllib_p3o.p3o": ["P3O", "P3OConfig"],
                          "rllib_p3o.offline": ["validate_trajectories", "TrajectoryRecorder", "OfflineDataError"],
                          "rllib_p3o.env_runner": ["VLLMEnvRunner", "WeightSyncError"],
                          "rllib_p3o.tasks": ["ArithmeticTask", "arithmetic_reward", "build_demo_model"]}.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
