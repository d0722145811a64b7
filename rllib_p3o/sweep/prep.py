"""Artifacts some regimes of the claims sweep need, built once under ``<out>/prep`` and reused on a rerun:

- ``base_model``: the task's base model (seed 0), the policy every trial starts from (with `Grid.models_from`, the
  one a committed set was built with, copied, as is ``weaker_model``);
- ``train_prompts``/``heldout_prompts``: the task's rows as .jsonl;
- ``weaker_model``: an earlier checkpoint of the same pretraining (`Task.weaker_pretrain_steps`);
- ``stale_recording``: trajectory Parquet sampled by the frozen base policy (an "older policy" for every trial:
  the further a trial's policy moves, the staler these data are for it);
- ``weaker_recording``: the same, sampled by the frozen weaker model (another model's data);
  with `Grid.recording_per_seed` each is a folder of recordings, ``seed<s>/`` sampled with seed ``s`` for every seed
  the grid trains (`seed_recording`), so that a trial's seed changes the data it trains on;
- ``stronger_model``: the base model RL-trained with P3O and the task's config until its held-out accuracy
  reaches `Task.stronger_heldout`.

The recording and the stronger model come from one Algorithm: first ``lr=0`` with ``record_rollouts`` (the policy
stays the base model), then `P3O.reset_config` to the default learning rate, trained until the target.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Callable, Optional

from rllib_p3o.core import metrics
from rllib_p3o.sweep.grid import (
    TASKS,
    Grid,
    Prepared,
    Task,
    lr_schedule,
    recorded_seeds,
    repository_path,
    seed_recording,
)

STAMP = "prepared.json"
# The models `Grid.models_from` supplies (the recordings are made per set: a confirmation set's seeds are its own).
MODELS = ("base_model", "weaker_model")
WEIGHTS = "model.safetensors"


def prepare(
    out: str, grid: Grid, needs: set, base_model: Optional[str] = None, say: Callable[[str], None] = print
) -> Prepared:
    """Build (or reuse) what ``needs`` (names of `Prepared` fields) asks for; ``base_model`` skips building one."""
    prep_dir = os.path.join(out, "prep")
    os.makedirs(prep_dir, exist_ok=True)
    stamp = os.path.join(prep_dir, STAMP)
    done = _moved_with(prep_dir, json.load(open(stamp))) if os.path.exists(stamp) else {}
    task = TASKS[grid.task]
    if base_model is None:  # a base model of the user's own: the grid builds its weaker model too, as without one
        committed = _committed_models(grid, prep_dir, say)
        done.update(committed)
        base_model = committed.get("base_model")
    if base_model is None:
        say(f"[prep] {task.name} base model (pretrained once, a few minutes; reused on a rerun)")
        base_model = task.build_model(os.path.join(prep_dir, "base_model"), seed=0)
    done["base_model"] = base_model
    train, heldout = task.rows()
    for key, rows in (("train_prompts", train), ("heldout_prompts", heldout)):
        done[key] = os.path.join(prep_dir, f"{key}.jsonl")
        with open(done[key], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    if "weaker_model" in needs and "weaker_model" not in done:
        say(f"[prep] weaker model: the same pretraining stopped after {task.weaker_pretrain_steps} steps")
        done["weaker_model"] = task.build_model(
            os.path.join(prep_dir, "weaker_model"), seed=0, pretrain_steps=task.weaker_pretrain_steps
        )
    if "stronger_model" in needs and "stronger_model" not in done:
        done.update(_record_then_train(task, base_model, prep_dir, grid, say))
    # A grid with a recording per seed records seed 0's here only where it trains seed 0 (a confirmation set's seeds
    # are others); the loop below records the rest.
    first = not grid.recording_per_seed or 0 in recorded_seeds(grid)
    if "stale_recording" in needs and "stale_recording" not in done:
        path = os.path.join(prep_dir, "stale_recording")
        if first:
            say(f"[prep] stale recording: {grid.iterations} iterations sampled by the frozen base policy → {path}")
            _record(task, base_model, _seed0(path, grid), grid)
        done["stale_recording"] = path
    if "weaker_recording" in needs and "weaker_recording" not in done:
        if "weaker_model" not in done:
            done["weaker_model"] = task.build_model(
                os.path.join(prep_dir, "weaker_model"), seed=0, pretrain_steps=task.weaker_pretrain_steps
            )
        path = os.path.join(prep_dir, "weaker_recording")
        if first:
            say(f"[prep] weaker recording: {grid.iterations} iterations sampled by the frozen weaker model")
            _record(task, done["weaker_model"], _seed0(path, grid), grid)
        done["weaker_recording"] = path
    if grid.recording_per_seed:  # every seed's recording (seed 0's came with the folder)
        for key, model in (("stale_recording", base_model), ("weaker_recording", done.get("weaker_model"))):
            if key not in needs:
                continue
            for seed in recorded_seeds(grid):
                path = seed_recording(done[key], seed)
                if not os.path.isdir(path) or not os.listdir(path):
                    say(f"[prep] {key.replace('_', ' ')}, seed {seed}: {grid.iterations} iterations → {path}")
                    _record(task, model, path, grid, seed=seed)
    with open(stamp, "w") as f:
        json.dump(done, f, indent=2)
    return Prepared(**{k: done.get(k) for k in Prepared.__dataclass_fields__})


def _committed_models(grid: Grid, prep_dir: str, say: Callable[[str], None]) -> dict:
    """The base and weaker models of `Grid.models_from`, copied into ``prep_dir`` (once) so that the set's own folder
    holds what it trained: ``{"base_model": path, "weaker_model": path}`` for those the folder has; none without it."""
    if not grid.models_from:
        return {}
    source = repository_path(grid.models_from)
    if not os.path.isdir(source):
        say(f"[prep] {source} not found: building the models instead of the committed ones")
        return {}
    models = {}
    for key in MODELS:
        src, dst = os.path.join(source, key), os.path.join(prep_dir, key)
        if not os.path.isdir(src):
            continue
        if not os.path.isdir(dst):
            say(f"[prep] {key.replace('_', ' ')}: the committed one from {src}")
            shutil.rmtree(dst + ".tmp", ignore_errors=True)  # an interrupted copy's files
            shutil.copytree(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        elif not same_weights(src, dst):
            raise ValueError(
                f"{dst} is not the model committed in {src} (its {WEIGHTS} differs): this set trains the committed "
                f"one; delete {dst} (or start over with --fresh) so that it is copied"
            )
        models[key] = dst
    return models


def same_weights(a: str, b: str) -> bool:
    """Whether two model folders hold the same weights file, byte for byte."""
    with open(os.path.join(a, WEIGHTS), "rb") as x, open(os.path.join(b, WEIGHTS), "rb") as y:
        return x.read() == y.read()


def _moved_with(prep_dir: str, done: dict) -> dict:
    """The stamp's paths, those that no longer exist found under ``prep_dir`` by name: a prep folder copied elsewhere
    (from the repository's committed copy of a grid in progress, or another clone) is reused, not rebuilt."""
    out = {}
    for key, value in done.items():
        moved = os.path.join(prep_dir, os.path.basename(value)) if isinstance(value, str) else None
        out[key] = moved if moved and not os.path.exists(value) and os.path.exists(moved) else value
    return out


def _seed0(path: str, grid: Grid) -> str:
    """Where a regime's one recording goes: the folder itself, or its seed-0 recording with `Grid.recording_per_seed`
    (the same rows as a one-recording grid's: its config's seed is 0)."""
    return seed_recording(path, 0) if grid.recording_per_seed else path


def _record(task: Task, model: str, recording: str, grid: Grid, seed: int = 0) -> str:
    """``grid.iterations`` iterations of trajectories sampled by ``model``, frozen (``lr=0``), with ``seed`` (its
    prompts' order and samples), written to ``recording``; returns its path."""
    frozen = task.config(model, lr=0.0, eval_interval=0, record_rollouts=recording, **grid.extra)
    frozen.debugging(seed=seed)
    frozen.environment(env_config={**frozen.env_config, "reward_fn": task.reward_fn})
    frozen.fault_tolerance(restart_failed_env_runners=False)
    algo = frozen.build_algo()
    try:
        for _ in range(grid.iterations):
            algo.train()
    finally:
        algo.stop()
    return recording


def _record_then_train(task: Task, base_model: str, prep_dir: str, grid: Grid, say: Callable[[str], None]) -> dict:
    folder = os.path.join(prep_dir, "stale_recording")
    recording = _seed0(folder, grid)
    stronger = os.path.join(prep_dir, "stronger_model")
    frozen = task.config(base_model, lr=0.0, eval_interval=0, record_rollouts=recording, **grid.extra)
    frozen.environment(env_config={**frozen.env_config, "reward_fn": task.reward_fn})
    # A short job in this process: a runner fault ends it (and Ray prints no warning about restartable actors).
    frozen.fault_tolerance(restart_failed_env_runners=False)
    algo = frozen.build_algo()
    try:
        say(f"[prep] stale recording: {grid.iterations} iterations sampled by the frozen base policy → {recording}")
        for _ in range(grid.iterations):
            algo.train()
        trained = frozen.copy(copy_frozen=False).training(
            lr=lr_schedule(grid.default_lr), eval_interval=5, record_rollouts=None
        )
        algo.reset_config(trained.to_dict())
        algo._iteration = 0  # (Tune resets this itself when it reuses an actor)
        heldout, max_iterations = 0.0, 10 * grid.iterations
        while heldout < task.stronger_heldout and algo.iteration < max_iterations:
            result = algo.train()
            measured = result.get(metrics.P3O, {}).get(metrics.HELDOUT_REWARD_MEAN, float("nan"))
            heldout = heldout if math.isnan(measured) else measured
        say(f"[prep] stronger model: held-out {heldout:.3f} after {algo.iteration} iterations → {stronger}")
        algo.export_hf(stronger)
    finally:
        algo.stop()
    return {"stale_recording": folder, "stronger_model": stronger, "stronger_heldout": heldout}
