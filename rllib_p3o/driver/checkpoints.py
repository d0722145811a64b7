"""Checkpoints that know they are complete: a manifest written last, checked before a restore.

A crash mid-write or a full disk leaves a checkpoint directory that looks like any other but holds a truncated state
file; restoring it fails deep inside unpickling, naming neither the checkpoint nor the file. So `P3O` writes
``p3o_manifest.json`` into every checkpoint *after* everything else (as torch DCP writes its metadata and Orbax its
commit marker last): each file's relative path, size and BLAKE2b digest. `verify` checks a checkpoint against it
and raises `DamagedCheckpointError` naming the checkpoint and the first damaged file; `newest_intact` finds, among
a Tune trial's ``checkpoint_*`` siblings, the newest older one that verifies, which `restore_intact` restores
instead, with a warning (`P3O.restore_from_path` restores through it). `reported_iterations` tells whether a Tune
trial that starts without a checkpoint has reported results before (`P3O.train` refuses to start it over silently).

Large files are hashed at their head and tail only (`FULL_HASH_MAX_BYTES`): their size still catches truncation,
the usual damage, at a cost that does not grow with the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

MANIFEST = "p3o_manifest.json"
MANIFEST_VERSION = 1
# Files up to this size are hashed whole; larger ones at their first and last `SAMPLE_BYTES` (sizes always exact).
FULL_HASH_MAX_BYTES = 256 * 2**20
SAMPLE_BYTES = 16 * 2**20
_CHUNK = 4 * 2**20
# Tune's checkpoint directories inside a trial directory: checkpoint_000012.
TUNE_CHECKPOINT = re.compile(r"^checkpoint_(\d+)$")

logger = logging.getLogger(__name__)


class DamagedCheckpointError(RuntimeError):
    """A checkpoint whose files do not match its manifest, or that has none (interrupted while being written)."""

    def __init__(self, checkpoint: str, problem: str):
        self.checkpoint, self.problem = checkpoint, problem
        super().__init__(f"checkpoint {checkpoint} is damaged: {problem}")


def _digest(path: str, size: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= FULL_HASH_MAX_BYTES:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        else:
            h.update(f.read(SAMPLE_BYTES))
            f.seek(size - SAMPLE_BYTES)
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _files(checkpoint: str) -> List[str]:
    found = []
    for dirpath, _, names in os.walk(checkpoint):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), checkpoint)
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def write_manifest(checkpoint: str) -> str:
    """Write the manifest of every file under ``checkpoint`` (call it after the last of them is written); returns
    its path. Written to a temporary name and renamed, so a manifest is never itself half-written."""
    entries: Dict[str, Dict[str, object]] = {}
    for rel in _files(checkpoint):
        path = os.path.join(checkpoint, rel)
        size = os.path.getsize(path)
        entries[rel] = {"size": size, "blake2b": _digest(path, size)}
    path = os.path.join(checkpoint, MANIFEST)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"version": MANIFEST_VERSION, "files": entries}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def has_manifest(checkpoint: str) -> bool:
    return os.path.exists(os.path.join(checkpoint, MANIFEST))


def verify(checkpoint: str) -> None:
    """Raise `DamagedCheckpointError` unless every file the manifest lists is there with its size and digest. A
    checkpoint without a manifest raises too (see `P3O.restore_from_path` for those of older versions)."""
    path = os.path.join(checkpoint, MANIFEST)
    if not os.path.exists(path):
        raise DamagedCheckpointError(checkpoint, f"it has no {MANIFEST} (it was not finished being written)")
    try:
        with open(path) as f:
            entries = json.load(f)["files"]
    except (OSError, ValueError, KeyError) as e:
        raise DamagedCheckpointError(checkpoint, f"its {MANIFEST} cannot be read ({e})") from None
    for rel, want in entries.items():
        file = os.path.join(checkpoint, rel)
        if not os.path.exists(file):
            raise DamagedCheckpointError(checkpoint, f"{rel} is missing")
        size = os.path.getsize(file)
        if size != want["size"]:
            raise DamagedCheckpointError(checkpoint, f"{rel} is {size} bytes, {want['size']} when it was written")
        if _digest(file, size) != want["blake2b"]:
            raise DamagedCheckpointError(checkpoint, f"{rel} has other contents than when it was written")


def tune_siblings(checkpoint: str) -> List[str]:
    """The ``checkpoint_*`` directories beside ``checkpoint`` (a Tune trial's), newest first; empty elsewhere."""
    checkpoint = os.path.abspath(checkpoint)
    if not TUNE_CHECKPOINT.match(os.path.basename(checkpoint)):
        return []
    parent = os.path.dirname(checkpoint)
    found = [(int(m.group(1)), name) for name in os.listdir(parent) if (m := TUNE_CHECKPOINT.match(name))]
    return [os.path.join(parent, name) for _, name in sorted(found, reverse=True)]


def newest_intact(checkpoint: str) -> Optional[str]:
    """Among ``checkpoint``'s Tune siblings older than it, the newest that verifies; None when there is none (or
    ``checkpoint`` is not one of a Tune trial's)."""
    match = TUNE_CHECKPOINT.match(os.path.basename(os.path.abspath(checkpoint)))
    if not match:
        return None
    number = int(match.group(1))
    for sibling in tune_siblings(checkpoint):
        if int(TUNE_CHECKPOINT.match(os.path.basename(sibling)).group(1)) >= number:
            continue
        try:
            verify(sibling)
        except DamagedCheckpointError:
            continue
        return sibling
    return None


def is_local_dir(path: Any, filesystem: Any = None) -> bool:
    """Whether a checkpoint ``path`` (with RLlib's pyarrow ``filesystem``, or None) is a directory on this node."""
    local_fs = filesystem is None or getattr(filesystem, "type_name", None) == "local"
    return local_fs and isinstance(path, str) and os.path.isdir(path)


def restore_intact(path: Any, restore: Callable[[Any], None], filesystem: Any = None) -> Any:
    """``restore(path)`` of a checkpoint verified against its manifest or, if it is damaged (a file missing,
    truncated or changed; or, without a manifest, one that fails to load), ``restore`` of the newest intact Tune
    sibling before it, with a warning; returns what was restored. `DamagedCheckpointError` names the file when there
    is no intact one."""
    local = is_local_dir(path, filesystem)
    try:
        if local and has_manifest(path):
            verify(path)
        try:
            restore(path)
            return path
        except Exception as e:
            if not local or has_manifest(path):
                raise
            # No manifest (a checkpoint of an older version, or one cut short): a failed load names it.
            raise DamagedCheckpointError(path, f"it has no manifest and fails to load ({e!r})") from e
    except DamagedCheckpointError as damaged:
        fallback = newest_intact(path) if local else None
        if fallback is None:
            raise DamagedCheckpointError(
                damaged.checkpoint,
                f"{damaged.problem}; no intact checkpoint before it. Restore an earlier checkpoint explicitly "
                "(P3O.from_checkpoint(path)) or start over.",
            ) from None
        logger.warning(
            "Checkpoint %s is damaged (%s): restoring %s, the newest intact checkpoint before it; the iterations "
            "after it are trained again.",
            damaged.checkpoint,
            damaged.problem,
            fallback,
        )
        restore(fallback)
        return fallback


class NothingToResumeError(RuntimeError):
    """A Tune trial that has trained before is started again without a checkpoint: it would start over silently."""


def refuse_silent_restart(trial_storage: Any) -> None:
    """Raise `NothingToResumeError` if the Tune trial of ``trial_storage`` (None: not a Tune trial) has reported
    results before but starts without a checkpoint (``Tuner.restore(..., resume_errored=True)`` or a retry of a run
    without checkpoints): it would train from iteration 1 again, next to its earlier results. Nothing of those is
    touched."""
    if trial_storage is None or getattr(trial_storage, "trial_dir_name", None) is None:
        return
    reported, where = reported_iterations(trial_storage)
    if reported:
        raise NothingToResumeError(
            f"Nothing to resume from: trial {trial_storage.trial_dir_name} has reported {reported} iteration(s) before "
            f"({where}) but Tune has no checkpoint of it, so it would start over from iteration 1. To resume "
            "runs, checkpoint them: tune.RunConfig(checkpoint_config=tune.CheckpointConfig(checkpoint_frequency"
            "=N, checkpoint_at_end=True)). To start this trial over, use tune.Tuner.restore(path, "
            "trainable='P3O', restart_errored=True) (it gets a new directory; this one is kept)."
        )


def reported_iterations(trial_storage: Any) -> Tuple[int, str]:
    """How many results a Tune trial has reported so far (the lines of its result.json), and where: on the storage
    filesystem, or in the driver's staging copy when it is on this node (Tune syncs it to storage now and then)."""
    from ray.tune.result import EXPR_RESULT_FILE

    counts = []
    try:
        with trial_storage.storage_filesystem.open_input_stream(
            f"{trial_storage.trial_fs_path}/{EXPR_RESULT_FILE}"
        ) as f:
            counts.append((f.read().count(b"\n"), f"{trial_storage.trial_fs_path}/{EXPR_RESULT_FILE}"))
    except (FileNotFoundError, OSError):
        pass
    staged = os.path.join(trial_storage.trial_driver_staging_path, EXPR_RESULT_FILE)
    if os.path.isfile(staged):
        with open(staged, "rb") as f:
            counts.append((f.read().count(b"\n"), staged))
    return max(counts, default=(0, ""))
