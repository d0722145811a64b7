"""Old import paths, kept until rllib-p3o 0.4: modules that moved are importable under their old names, with a
DeprecationWarning (once per name) that says where they went and when the old name goes.

``import rllib_p3o.offline`` (or ``from rllib_p3o.sampler import Sampler``) returns the module that now holds that
code, the same module object; `MOVED` says where each one went. Nothing new should be added here: import the new
paths. (Names that moved out of a module that still exists, such as `rllib_p3o.runner.env`'s datasets and reward
functions, warn from that module's ``__getattr__``.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Dict, Optional, Sequence

from rllib_p3o.core.deprecation import warn_once

# old module name -> the module that holds its code now
MOVED: Dict[str, str] = {
    "rllib_p3o.p3o_config": "rllib_p3o.p3o",  # P3OConfig lives beside P3O, as RLlib's algorithms do
    "rllib_p3o.objectives": "rllib_p3o.core.objectives",
    "rllib_p3o.losses": "rllib_p3o.core.losses",
    "rllib_p3o.columns": "rllib_p3o.core.columns",
    "rllib_p3o.sources": "rllib_p3o.core.sources",
    "rllib_p3o.metrics": "rllib_p3o.core.metrics",
    "rllib_p3o.lora": "rllib_p3o.core.lora",
    "rllib_p3o.chat": "rllib_p3o.data.chat",
    "rllib_p3o.batching": "rllib_p3o.data.batching",
    "rllib_p3o.trajectories": "rllib_p3o.data.trajectories",
    "rllib_p3o.recorder": "rllib_p3o.data.recorder",
    "rllib_p3o.offline": "rllib_p3o.data",  # the trajectory API, re-exported by the data package
    "rllib_p3o.offline_data": "rllib_p3o.data.offline_data",
    "rllib_p3o.prompt_schedule": "rllib_p3o.data.prompt_schedule",
    "rllib_p3o.env_runner": "rllib_p3o.runner.env_runner",
    "rllib_p3o.rollouts": "rllib_p3o.runner.rollouts",
    "rllib_p3o.episodes": "rllib_p3o.data.episodes",
    "rllib_p3o.runner.episodes": "rllib_p3o.data.episodes",  # the episode format both ends speak
    "rllib_p3o.env": "rllib_p3o.runner.env",
    "rllib_p3o.multiturn": "rllib_p3o.runner.multiturn",
    "rllib_p3o.vllm_engine": "rllib_p3o.runner.vllm_engine",
    "rllib_p3o.vllm_ext": "rllib_p3o.runner.vllm_ext",
    "rllib_p3o.rl_module": "rllib_p3o.learner.rl_module",
    "rllib_p3o.torch": "rllib_p3o.learner",
    "rllib_p3o.torch.p3o_torch_learner": "rllib_p3o.learner.p3o_torch_learner",
    "rllib_p3o.weight_sync": "rllib_p3o.driver.weight_sync",  # the payload format is in rllib_p3o.sync.payload
    "rllib_p3o.sync.push": "rllib_p3o.driver.weight_sync",
    "rllib_p3o.probe": "rllib_p3o.sync.probe",
    # The driver's room (rllib_p3o/driver/).
    "rllib_p3o.sampler": "rllib_p3o.driver.sampler",
    "rllib_p3o.engine_runners": "rllib_p3o.driver.runner_calls",
    "rllib_p3o.trial_reuse": "rllib_p3o.driver.trial_reuse",
    "rllib_p3o.preflight": "rllib_p3o.driver.preflight",
    "rllib_p3o.progress": "rllib_p3o.driver.progress",
    # The batch sources, interface and both implementations, in one driver module.
    "rllib_p3o.data.batch_source": "rllib_p3o.driver.batch_sources",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of `MOVED` and loads them as the new modules (the same module objects), warning once."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 3: past warn_once and this method to the importing line (the import system's frames are skipped)
        warn_once(spec.name, MOVED[spec.name], stacklevel=3)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would otherwise load a second
    copy of a moved module found through an old package's path (``rllib_p3o.torch.p3o_torch_learner``)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
