"""The built-in base models' cache: a model directory remembers the settings it was built with, and a build with the
same settings reuses it instead of pretraining again (`build_demo_model`, `build_sorting_model`,
`build_addition_model`, `build_tool_model`).

The settings include the torch thread count: it changes the pretraining's floats (the reduction order), so a model
built with another count is another model.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

# The file in a model directory that holds the settings it was built with.
STAMP_FILE = "pretrain_args.json"


def built_with(path: str, settings: Dict[str, Any]) -> bool:
    """Whether ``path`` holds a model built with exactly ``settings``."""
    stamp = os.path.join(path, STAMP_FILE)
    if not os.path.exists(stamp):
        return False
    with open(stamp) as f:
        return json.load(f) == settings


def mark_built(path: str, settings: Dict[str, Any]) -> None:
    """Record that ``path`` now holds a model built with ``settings`` (after the build, so a build cut short is
    never reused)."""
    with open(os.path.join(path, STAMP_FILE), "w") as f:
        json.dump(settings, f)
