"""Provenance of offline data: which model wrote a trajectory file, and whether that is the policy being trained.

Another model's tokens are not stale copies of the policy's: a trust region around their recorder, or a KL pull toward
it, is the wrong prior for them (a weaker recorder pulls the policy down). So every offline row is read as either
the policy's own data (written by the trained model's lineage: the weights the run starts from, an earlier run of
the same model, a model this run was exported from) or another model's (`rllib_p3o.core.sources.is_other_model`:
it then gets what a behavior model's live rows get).

What a recording says of its writer, per row (`rllib_p3o.data.recorder` writes them):

    column             type     meaning
    model_name         string   the model that sampled the row: its directory name or hub id
    model_fingerprint  string   `fingerprint` of the weights that model started from (a frozen model: its weights)
    policy_version     int      updates applied since (the schema's existing column)

How a file is read (`classify`), in order:

1. the per-input override ``offline_provenance`` (``"policy"`` or ``"other"``, for every input or per input path);
2. a row whose ``model_fingerprint`` is in the policy's `lineage` is the policy's own; another fingerprint is
   another model's, named by its ``model_name``;
3. a row without provenance (third-party data, a file recorded before these columns existed) is another model's,
   named by its input (``offline/behavior/<input name>``): nothing says it is the policy's.

A model directory's lineage is its own fingerprint and those it lists in ``p3o_lineage.json``, which
`write_lineage` puts beside every exported model: a model exported from a run knows the weights the run started
from, so a run that continues from it reads the earlier run's recordings as its own.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Union

MODEL_NAME = "model_name"
MODEL_FINGERPRINT = "model_fingerprint"
LINEAGE_FILE = "p3o_lineage.json"
# `offline_provenance` values: the reading of the files' own columns, or one answer for every row.
AUTO, POLICY_OWN, OTHER_MODEL = "auto", "policy", "other"
PROVENANCE_CHOICES = (AUTO, POLICY_OWN, OTHER_MODEL)
# A row's recorder as the prelearner reads it (added to each row by `P3OOfflineData`): None for the policy's own data,
# else the name of the model that wrote it.
RECORDER = "_p3o_recorder"

# Weight files a fingerprint reads, and how much of each: `_CHUNKS` evenly spaced chunks of `_CHUNK_BYTES`, so a
# 14 GB checkpoint costs a few MB of reads, and two different models (or the same model trained further) differ in
# every chunk.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_CHUNKS = 16
_CHUNK_BYTES = 1 << 16


def _model_dir(model: str) -> Optional[str]:
    """``model``'s local directory: itself, or a hub id's snapshot in the local cache (None when neither)."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception:  # not a hub id, or not cached here: no fingerprint
        return None


def fingerprint(model: Optional[str]) -> Optional[str]:
    """A short hash of a model's weights (``sha256:`` + 16 hex digits): the names and sizes of its weight files and
    `_CHUNKS` chunks of each. None when ``model`` is no local directory or cached hub id, or holds no weight file."""
    directory = _model_dir(str(model)) if model else None
    if directory is None:
        return None
    files = sorted({f for pattern in _WEIGHT_PATTERNS for f in glob.glob(os.path.join(directory, pattern))})
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        size = os.path.getsize(path)
        digest.update(f"{os.path.basename(path)}:{size}".encode())
        with open(path, "rb") as f:
            for k in range(_CHUNKS):
                f.seek(max(0, (size - _CHUNK_BYTES) * k // max(1, _CHUNKS - 1)))
                digest.update(f.read(_CHUNK_BYTES))
    return "sha256:" + digest.hexdigest()[:16]


def model_name(model: Optional[str]) -> str:
    """How a recording names a model: its directory's name, or a hub id as it is."""
    text = str(model or "unknown")
    return os.path.basename(os.path.normpath(text)) if os.path.isdir(text) else text


def lineage(model: Optional[str]) -> Set[str]:
    """The fingerprints of ``model``'s weights and of the models it was trained from (its ``p3o_lineage.json``)."""
    own = fingerprint(model)
    out = {own} if own else set()
    directory = _model_dir(str(model)) if model else None
    path = os.path.join(directory, LINEAGE_FILE) if directory else None
    if path and os.path.isfile(path):
        with open(path) as f:
            out |= set(json.load(f).get("fingerprints", []))
    return out


def write_lineage(out_dir: str, trained_from: Optional[str]) -> None:
    """Write ``p3o_lineage.json`` into an exported model directory: the lineage of the model the run started from
    (`lineage`), so that recordings of that run read as this model's own."""
    fingerprints = sorted(lineage(trained_from))
    if not fingerprints:
        return
    with open(os.path.join(out_dir, LINEAGE_FILE), "w") as f:
        json.dump({"trained_from": model_name(trained_from), "fingerprints": fingerprints}, f, indent=2)


def recording_writers(policy_model: Optional[str], behavior_models: Sequence[Mapping[str, Any]] = ()) -> Dict:
    """What a run's recorder writes of each of its data sources (`rllib_p3o.data.recorder.TrajectoryRecorder`):
    ``{source name: (model_name, fingerprint)}`` for the policy (the weights the run started from) and each behavior
    model."""
    from rllib_p3o.core.sources import POLICY, behavior_source_name

    writers = {POLICY: (model_name(policy_model), fingerprint(policy_model))}
    for spec in behavior_models:
        writers[behavior_source_name(spec)] = (model_name(spec.get("model")), fingerprint(spec.get("model")))
    return writers


Override = Union[str, Mapping[str, str], None]


def override_for(path: str, override: Override) -> str:
    """The ``offline_provenance`` answer for a file at ``path``: the value for every input, or the value of the
    longest input path in the mapping that holds the file (`AUTO` where none does)."""
    if override is None or isinstance(override, str):
        return override or AUTO
    best, answer = -1, AUTO
    for prefix, value in override.items():
        norm = _norm(prefix)
        if (_norm(path) == norm or _norm(path).startswith(norm.rstrip("/") + "/")) and len(norm) > best:
            best, answer = len(norm), value
    return answer


def _norm(path: str) -> str:
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return text.rstrip("/") if "://" in text else os.path.normpath(os.path.abspath(text))


@dataclasses.dataclass(frozen=True)
class FileProvenance:
    """How one file's rows are read: each (model_name, fingerprint) it holds → its recorder (None: the policy's own),
    and why, for the first screen and ``rllib-p3o validate``."""

    file: str
    recorders: Dict[Optional[str], Optional[str]]  # fingerprint (None: the rows without one) -> recorder name
    reasons: List[str]

    @property
    def kinds(self) -> Set[str]:
        return {POLICY_OWN if r is None else OTHER_MODEL for r in self.recorders.values()}

    def recorder(self, row_fingerprint: Optional[str]) -> Optional[str]:
        return self.recorders.get(row_fingerprint or None)

    def line(self) -> str:
        """One line: the file and how its rows are read."""
        return f"{self.file}: " + "; ".join(self.reasons)


def classify(
    file: str,
    writers: Iterable[tuple],
    policy_lineage: Set[str],
    override: Override = None,
    input_name: Optional[str] = None,
) -> FileProvenance:
    """How the rows of ``file`` are read (module docstring). ``writers``: the distinct (model_name, fingerprint)
    pairs of its rows (None where a row records none); ``policy_lineage``: `lineage` of the policy; ``input_name``:
    the name rows without provenance are recorded under (their input's)."""
    answer = override_for(file, override)
    fallback = input_name or os.path.splitext(os.path.basename(file.rstrip("/")))[0]
    recorders: Dict[Optional[str], Optional[str]] = {}
    reasons: List[str] = []
    for name, fp in sorted(set(writers), key=lambda w: (str(w[0]), str(w[1]))):
        fp = fp or None
        label = name or fallback
        if answer == POLICY_OWN:
            recorders[fp] = None
            reasons.append(f"{label}: the policy's own (offline_provenance='policy')")
        elif answer == OTHER_MODEL:
            recorders[fp] = label
            reasons.append(f"{label}: another model's (offline_provenance='other')")
        elif fp is None:
            recorders[fp] = label
            reasons.append(
                f"{label}: another model's (no model_fingerprint recorded; offline_provenance='policy' if the policy "
                "wrote it)"
            )
        elif fp in policy_lineage:
            recorders[fp] = None
            reasons.append(f"{label}: the policy's own (its fingerprint {fp} is the policy's lineage)")
        else:
            recorders[fp] = label
            reasons.append(f"{label}: another model's (fingerprint {fp}, not the policy's lineage)")
    return FileProvenance(file, recorders, reasons)


def writers_of(columns: Mapping[str, Sequence[Any]], num_rows: int) -> Set[tuple]:
    """The distinct (model_name, fingerprint) pairs of a file's rows, from its provenance columns (absent: one pair
    of Nones for every row)."""
    names = columns.get(MODEL_NAME) or [None] * num_rows
    fps = columns.get(MODEL_FINGERPRINT) or [None] * num_rows
    return set(zip(names, fps)) or {(None, None)}


def summary(files: Sequence[FileProvenance]) -> str:
    """A few lines: how many files are read as the policy's own and as another model's, and each reading."""
    own = sum(POLICY_OWN in f.kinds and OTHER_MODEL not in f.kinds for f in files)
    other = sum(OTHER_MODEL in f.kinds and POLICY_OWN not in f.kinds for f in files)
    mixed = len(files) - own - other
    head = f"provenance: {own} file(s) the policy's own, {other} another model's" + (
        f", {mixed} with both" if mixed else ""
    )
    distinct = list(dict.fromkeys(reason for f in files for reason in f.reasons))
    return "\n".join([head] + [f"  {reason}" for reason in distinct[:10]])


@dataclasses.dataclass(frozen=True)
class FileReading:
    """How one file is read: its provenance (`FileProvenance`) and the source names its rows get
    (`rllib_p3o.core.sources.offline_source_name`)."""

    reading: FileProvenance
    source_names: Set[str]


def read_provenance(locations: Sequence[Any], policy_model: Optional[str], override: Override, inputs: Any) -> List:
    """Each file's `FileReading` against ``policy_model``'s lineage and ``override`` (``offline_provenance``), from its
    ``source`` and provenance columns alone. ``locations``: `rllib_p3o.core.storage.Location`s of the files;
    ``inputs``: ``offline_data(input_=...)``'s value (rows without provenance are recorded under their input's name)."""
    import pyarrow.parquet as pq

    from rllib_p3o.core.sources import OFFLINE, offline_source_name

    policy_lineage = lineage(policy_model)
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    out = []
    for location in locations:
        names = pq.read_schema(location.path, filesystem=location.filesystem).names
        wanted = [c for c in ("source", MODEL_NAME, MODEL_FINGERPRINT) if c in names]
        table = pq.read_table(location.path, columns=wanted, filesystem=location.filesystem) if wanted else None
        cols = {c: table.column(c).to_pylist() for c in wanted} if table is not None else {}
        num_rows = table.num_rows if table is not None else pq.read_metadata(location.path).num_rows
        reading = classify(
            location.uri,
            writers_of(cols, num_rows),
            policy_lineage,
            override,
            input_name=_input_name(location.uri, inputs),
        )
        sources = cols.get("source") or [None] * num_rows
        fps = cols.get(MODEL_FINGERPRINT) or [None] * num_rows
        source_names = {offline_source_name(s, reading.recorder(fp)) for s, fp in zip(sources, fps)} or {OFFLINE}
        out.append(FileReading(reading, source_names))
    return out


def _input_name(file: str, inputs: Sequence[Any]) -> Optional[str]:
    """The name of the input (an entry of ``input_``) that holds ``file``: rows without provenance are another
    model's, recorded under it."""
    for item in inputs:
        if item is None:
            continue
        text = os.fspath(item).rstrip("/")
        if bare_path(file) == bare_path(text) or bare_path(file).startswith(bare_path(text) + "/"):
            return os.path.splitext(os.path.basename(text))[0]
    return None


def bare_path(path: str) -> str:
    """A path or URI without its scheme (Ray Data's ``include_paths`` column names files so), normalized."""
    return os.path.normpath(os.fspath(path).split("://", 1)[-1])
