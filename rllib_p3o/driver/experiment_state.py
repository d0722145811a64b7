"""Tune's experiment state file (``experiment_state-*.json``), which ``Tuner.restore`` reads to continue a run: found
unreadable before a restore, and put back from Tune's own intact copy where one is left.

Tune writes the state on the driver in two steps, neither atomic: into the Ray session's staging directory
(``<ray temp dir>/session_*/artifacts/<time>/<experiment>/driver_artifacts/``), then a copy into the experiment
directory, by a background thread. It does so at every step of its controller when ``TUNE_GLOBAL_CHECKPOINT_S=0``
(about ten times a second), else at most every 10 s. A driver killed during the copy leaves the experiment's file
empty or cut short and the staged one whole; killed during the staging write, the experiment's file is the
previous whole one. ``Tuner.restore`` on an unreadable file logs "Failed to restore the run state" and starts the
experiment over, its trials from iteration 1 again.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import List, Optional

from rllib_p3o.driver.checkpoints import tune_siblings

STATE_PATTERN = "experiment_state-*.json"
# The keys Tune's restore reads from the file.
STATE_KEYS = ("trial_data", "runner_data")
# The damaged file is kept beside the one put back, under a name Tune's pattern does not match.
DAMAGED_SUFFIX = ".damaged"


class DamagedExperimentStateError(RuntimeError):
    """The experiment state file that ``Tuner.restore`` would read cannot be read, and no intact copy was put back."""


def newest_state_file(experiment_path: str) -> Optional[str]:
    """The state file ``Tuner.restore`` reads: the greatest ``experiment_state-*.json`` name (one per driver start,
    named by its time)."""
    states = sorted(glob.glob(os.path.join(glob.escape(experiment_path), STATE_PATTERN)))
    return states[-1] if states else None


def state_problem(path: str) -> Optional[str]:
    """What is wrong with the state file at ``path`` ("is empty", "is cut short or damaged (...)", ...), or None when
    it reads as a Tune experiment state."""
    try:
        with open(path, "rb") as f:  # bytes: Tune's JSON is UTF-8 whatever the locale
            data = f.read()
    except OSError as error:
        return f"cannot be read ({error})"
    if not data:
        return "is empty"
    try:
        state = json.loads(data)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        return f"is cut short or damaged ({error})"
    if not isinstance(state, dict) or not all(key in state for key in STATE_KEYS):
        return f"is not a Tune experiment state (it lacks {' and '.join(STATE_KEYS)})"
    return None


def ray_temp_dir() -> str:
    """Where Ray keeps its sessions on this machine by default (``RAY_TMPDIR``, else ``TMPDIR``, else /tmp; then
    ``ray``): Ray's own answer where its private helper is importable."""
    try:
        from ray._common.utils import get_default_ray_temp_dir

        return get_default_ray_temp_dir()
    except ImportError:
        return os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")


def intact_staged_copy(state_path: str) -> Optional[str]:
    """Tune's staged copy of the state file ``state_path`` that reads whole, from the Ray sessions on this machine
    (the newest first); None when there is none. The file's name carries its driver's start time, so only that
    driver's copies match."""
    experiment = os.path.basename(os.path.dirname(os.path.abspath(state_path)))
    pattern = os.path.join(
        glob.escape(ray_temp_dir()),
        "session_*",
        "artifacts",
        "*",
        glob.escape(experiment),
        "driver_artifacts",
        glob.escape(os.path.basename(state_path)),
    )
    copies: List[str] = sorted(glob.glob(pattern), key=os.path.getmtime, reverse=True)
    return next((copy for copy in copies if state_problem(copy) is None), None)


def check_experiment_state(experiment_path: str, repair: bool = False) -> Optional[str]:
    """Check the state file that ``Tuner.restore(experiment_path, ...)`` would read, before it starts the experiment
    over on an unreadable one (module docstring).

    Nothing happens when the file reads, or when there is none (Tune's own error names that case). An unreadable one
    raises `DamagedExperimentStateError` naming it, Tune's intact staged copy if there is one, and each trial's
    newest checkpoint on disk. With ``repair``, that staged copy is put in its place instead (the damaged file kept
    with the suffix ``.damaged``) and its path returned.
    """
    state = newest_state_file(experiment_path)
    problem = state_problem(state) if state else None
    if state is None or problem is None:
        return None
    staged = intact_staged_copy(state)
    if staged is not None and repair:
        os.replace(state, state + DAMAGED_SUFFIX)
        shutil.copyfile(staged, state)
        return staged
    if staged is not None:
        way_out = (
            f"Tune's intact copy of it is {staged}: copy it over the damaged file and restore again "
            "(rllib-p3o train CONFIG --resume does this itself)."
        )
    else:
        checkpoints = glob.glob(os.path.join(glob.escape(experiment_path), "*", "checkpoint_*"))
        newest = {os.path.dirname(c): siblings[0] for c in sorted(checkpoints) if (siblings := tune_siblings(c))}
        way_out = (
            "No intact copy of it is left in the Ray sessions on this machine. Each trial's newest checkpoint on disk: "
            + "; ".join(newest.values())
            + ". P3O.from_checkpoint(path) continues a trial from one outside Tune."
            if newest
            else "No intact copy of it is left in the Ray sessions on this machine, and no trial has a checkpoint."
        )
    raise DamagedExperimentStateError(
        f"Tune's experiment state {state} {problem}: a driver killed while Tune rewrote it leaves it so, and "
        f"Tuner.restore would not continue the run from it (Tune starts the experiment over). {way_out}"
    )
