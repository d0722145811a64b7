"""Trajectory files (Parquet): the schema, its validator, rows → completion records, and the recorder.

The RLlib side of reading them (Ray Data, prelearner) is `rllib_p3o.offline_data`.

Schema: one row per completion.

    column             type                required                          meaning
    prompt             string              prompt or prompt_ids              prompt text
    prompt_ids         list<int>           prompt or prompt_ids              prompt token ids (policy tokenizer)
    completion         string              completion or completion_ids      completion text
    completion_ids     list<int>           completion or completion_ids      completion token ids
    reward             float               yes                               verifier reward, finite
    behavior_logprobs  list<float>         yes (or rescore, see below)       log π_b of each completion token, ≤ 0
    group_id           int or string       group_id or advantage             rows of one prompt group
    advantage          float               group_id or advantage             used as-is when present
    policy_version     int                 no                                weights version (weights_seq_no) that
                                                                             sampled the row
    source             string              no                                data source that produced the row:
                                                                             "policy", "behavior/<name>", ...
    temperature, top_p float               no                                sampling parameters

Text-only rows are tokenized with the policy's tokenizer; rows that carry ids are checked against it (every id
below its vocabulary size). When a row has both, the ids are authoritative: sampled ids need not be the
tokenizer's canonical encoding of their decoded text, and they are what the behavior log-probs refer to. ``behavior_logprobs`` must have one
entry per completion token. Rows without behavior log-probs are an error unless ``offline_rescore_model`` names
a model that scores them once; they are never silently treated as on-policy.

Online runs with ``record_rollouts=DIR`` write this same schema (`TrajectoryRecorder`), one file per iteration,
written to a temporary name and renamed: a file is complete or absent, whatever happens to the run. Read back, a
row's source becomes ``offline/<source>``; files recorded when the policy source was called "online" read as
``offline/policy`` too (`rllib_p3o.sources.offline_source_name`).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from rllib_p3o.columns import Infos, Record
from rllib_p3o.sources import POLICY, offline_source_name, source_id

PathSpec = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

REQUIRED_ONE_OF = (("prompt", "prompt_ids"), ("completion", "completion_ids"), ("group_id", "advantage"))
LIST_INT_COLUMNS = ("prompt_ids", "completion_ids")
# On disk, a record's weights_seq_no is called policy_version (the schema's documented name).
POLICY_VERSION = "policy_version"
# A log-prob above this is a data error (float32 noise can make log 1 = 0 slightly positive).
MAX_LOGPROB = 1e-4


class OfflineDataError(ValueError):
    """An offline dataset failed validation; the message lists file, row and column of every problem."""


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str
    row: Optional[int]
    column: Optional[str]
    message: str

    def __str__(self) -> str:
        where = self.file + (f" row {self.row}" if self.row is not None else "")
        return f"{where}" + (f" column '{self.column}'" if self.column else "") + f": {self.message}"


@dataclasses.dataclass
class ValidationReport:
    files: List[str]
    num_rows: int
    problems: List[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_rows(self) -> int:
        return len({(p.file, p.row) for p in self.problems if p.row is not None})

    def summary(self, limit: int = 50) -> str:
        head = (f"{len(self.files)} file(s), {self.num_rows} row(s): "
                + ("OK" if self.ok else f"{len(self.problems)} problem(s) in {self.bad_rows} row(s)"))
        lines = [head] + [f"  {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        return "\n".join(lines)


def list_parquet_files(paths: PathSpec) -> List[str]:
    """Parquet files of a file, a directory (recursively) or a list of those; sorted, never empty."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: List[str] = []
    for p in map(os.fspath, items):
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "*.parquet"), recursive=True))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise OfflineDataError(f"{p}: no such file or directory")
    if not files:
        raise OfflineDataError(f"{items}: no Parquet files found (the dataset is empty)")
    return files


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def check_row(row: Mapping[str, Any], *, vocab_size: Optional[int] = None, tokenizer=None,
              require_behavior: bool = True, max_seq_len: Optional[int] = None) -> List[tuple]:
    """Problems of one row as ``(column, message)`` pairs; empty when the row is valid."""
    out: List[tuple] = []
    for a, b in REQUIRED_ONE_OF:
        if row.get(a) is None and row.get(b) is None:
            out.append((f"{a}/{b}", f"needs '{a}' or '{b}'"))
    reward = row.get("reward")
    if reward is None or not _finite(reward):
        out.append(("reward", f"must be a finite number, got {reward!r}"))
    for col in ("advantage", "temperature", "top_p"):
        if row.get(col) is not None and not _finite(row[col]):
            out.append((col, f"must be a finite number, got {row[col]!r}"))
    for col in ("prompt", "completion"):
        if row.get(col) is not None and not isinstance(row[col], str):
            out.append((col, f"must be a string, got {type(row[col]).__name__}"))
    for col in LIST_INT_COLUMNS:
        ids = row.get(col)
        if ids is None:
            continue
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError):
            out.append((col, "must be a list of integers"))
            continue
        if any(i < 0 for i in ids):
            out.append((col, "negative token id"))
        if vocab_size is not None and any(i >= vocab_size for i in ids):
            out.append((col, f"token id {max(ids)} >= vocabulary size {vocab_size}"))
    n_completion = _completion_length(row, tokenizer)
    if n_completion == 0:
        out.append(("completion", "empty completion"))
    if max_seq_len is not None and n_completion:
        n_prompt = _prompt_length(row, tokenizer)
        if n_prompt is not None and n_prompt + n_completion > max_seq_len:
            out.append(("completion", f"prompt + completion = {n_prompt + n_completion} tokens, more than "
                                      f"offline_max_seq_len={max_seq_len}"))
    lps = row.get("behavior_logprobs")
    if lps is None:
        if require_behavior:
            out.append(("behavior_logprobs", "missing (set offline_rescore_model to score such rows, "
                                             "never treat them as on-policy)"))
    else:
        try:
            values = [float(v) for v in lps]
        except (TypeError, ValueError):
            out.append(("behavior_logprobs", "must be a list of floats"))
            values = None
        if values is not None:
            if n_completion is not None and len(values) != n_completion:
                out.append(("behavior_logprobs", f"has {len(values)} entries for {n_completion} completion tokens"))
            if not all(math.isfinite(v) for v in values):
                out.append(("behavior_logprobs", "non-finite log-prob"))
            elif any(v > MAX_LOGPROB for v in values):
                out.append(("behavior_logprobs", f"positive log-prob {max(values):.4g}"))
    return out


def _tokenize(tokenizer, text: str, column: str) -> List[int]:
    # Completions continue the prompt: no special tokens (BOS) in front of them.
    return tokenizer(text, add_special_tokens=(column == "prompt"))["input_ids"]


def _prompt_length(row: Mapping[str, Any], tokenizer) -> Optional[int]:
    if row.get("prompt_ids") is not None:
        return len(row["prompt_ids"])
    if isinstance(row.get("prompt"), str) and tokenizer is not None:
        return len(_tokenize(tokenizer, row["prompt"], "prompt"))
    return None


def _completion_length(row: Mapping[str, Any], tokenizer) -> Optional[int]:
    if row.get("completion_ids") is not None:
        try:
            return len(row["completion_ids"])
        except TypeError:
            return None
    if isinstance(row.get("completion"), str) and tokenizer is not None:
        return len(_tokenize(tokenizer, row["completion"], "completion"))
    if isinstance(row.get("completion"), str):
        return None if row["completion"] else 0
    return None


def validate_trajectories(paths: PathSpec, *, tokenizer=None, vocab_size: Optional[int] = None,
                          require_behavior: bool = True, max_seq_len: Optional[int] = None) -> ValidationReport:
    """Check every file and row of a trajectory dataset against the schema (see module docstring)."""
    import pyarrow.parquet as pq

    files = list_parquet_files(paths)
    if tokenizer is not None and vocab_size is None:
        vocab_size = len(tokenizer)
    problems: List[Problem] = []
    num_rows = 0
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as e:
            problems.append(Problem(f, None, None, f"cannot read Parquet: {e}"))
            continue
        names = set(table.column_names)
        missing = [f"'{a}' or '{b}'" for a, b in REQUIRED_ONE_OF if a not in names and b not in names]
        missing += [f"'{c}'" for c in ("reward",) if c not in names]
        if require_behavior and "behavior_logprobs" not in names:
            missing.append("'behavior_logprobs'")
        if missing:
            problems.append(Problem(f, None, None, "missing required column(s): " + ", ".join(missing)))
            num_rows += table.num_rows
            continue
        for i, row in enumerate(table.to_pylist()):
            for column, message in check_row(row, vocab_size=vocab_size, tokenizer=tokenizer,
                                             require_behavior=require_behavior, max_seq_len=max_seq_len):
                problems.append(Problem(f, i, column, message))
        num_rows += table.num_rows
    if num_rows == 0 and not problems:
        problems.append(Problem(", ".join(files), None, None, "the dataset has no rows"))
    return ValidationReport(files=files, num_rows=num_rows, problems=problems)


def row_to_record(row: Mapping[str, Any], tokenizer) -> Dict[str, Any]:
    """A validated row as a completion record (`rllib_p3o.columns.Record`), tokenizing text-only columns.

    The row's source becomes ``offline/<source>`` (`rllib_p3o.sources.offline_source_name`).
    """
    prompt_ids = row.get("prompt_ids")
    if prompt_ids is None:
        prompt_ids = _tokenize(tokenizer, row["prompt"], "prompt")
    completion_ids = row.get("completion_ids")
    if completion_ids is None:
        completion_ids = _tokenize(tokenizer, row["completion"], "completion")
    return {
        Record.PROMPT_IDS: np.asarray(prompt_ids, dtype=np.int64),
        Record.COMPLETION_IDS: np.asarray(completion_ids, dtype=np.int64),
        Record.BEHAVIOR_LOGPROBS: np.asarray(row["behavior_logprobs"], dtype=np.float32),
        Record.REWARD: float(row["reward"]),
        Record.ADVANTAGE: float(row["advantage"]) if row.get("advantage") is not None else None,
        Record.GROUP_ID: row.get("group_id"),
        Record.WEIGHTS_SEQ_NO: int(row[POLICY_VERSION]) if row.get(POLICY_VERSION) is not None else 0,
        Record.SOURCE_ID: source_id(offline_source_name(row.get("source"))),
    }


# -- recording -----------------------------------------------------------------------------------------------------

def records_to_table(records: Iterable[Mapping[str, Any]]):
    """Online completion records → a pyarrow table in the trajectory schema."""
    import pyarrow as pa

    rows = []
    for r in records:
        infos = r.get(Record.INFOS) or {}
        rows.append({
            "prompt": infos.get(Infos.PROMPT),
            "prompt_ids": [int(i) for i in r[Record.PROMPT_IDS]],
            "completion": infos.get(Infos.COMPLETION),
            "completion_ids": [int(i) for i in r[Record.COMPLETION_IDS]],
            "reward": float(r[Record.REWARD]),
            "behavior_logprobs": [float(v) for v in r[Record.BEHAVIOR_LOGPROBS]],
            "group_id": str(r[Record.GROUP_ID]),
            "advantage": float(r[Record.ADVANTAGE]) if r.get(Record.ADVANTAGE) is not None else None,
            POLICY_VERSION: int(r.get(Record.WEIGHTS_SEQ_NO, 0)),
            "source": str(infos.get(Infos.SOURCE, POLICY)),
            "temperature": infos.get(Infos.TEMPERATURE),
            "top_p": infos.get(Infos.TOP_P),
        })
    schema = pa.schema([
        ("prompt", pa.string()), ("prompt_ids", pa.list_(pa.int32())), ("completion", pa.string()),
        ("completion_ids", pa.list_(pa.int32())), ("reward", pa.float32()),
        ("behavior_logprobs", pa.list_(pa.float32())), ("group_id", pa.string()), ("advantage", pa.float32()),
        (POLICY_VERSION, pa.int64()), ("source", pa.string()), ("temperature", pa.float32()),
        ("top_p", pa.float32()),
    ])
    return pa.Table.from_pylist(rows, schema=schema)


class TrajectoryRecorder:
    """Writes batches of completion records as Parquet files ``part-<iteration>.parquet`` under ``directory``.

    Each file is written under a hidden temporary name, flushed to disk and renamed into place, so a reader (or a
    resumed run) sees complete files only, even if the run is killed mid-write. A run restored from a checkpoint
    calls `forget_after`, so the iterations it trains again are recorded once, not twice.
    """

    _PART = re.compile(r"^\.?part-(\d+)\.parquet(\.tmp)?$")

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    def write(self, records: Sequence[Mapping[str, Any]], iteration: int) -> str:
        import pyarrow.parquet as pq

        final = os.path.join(self.directory, f"part-{iteration:07d}.parquet")
        tmp = os.path.join(self.directory, f".part-{iteration:07d}.parquet.tmp")
        pq.write_table(records_to_table(records), tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return final

    def forget_after(self, iterations_done: int) -> List[str]:
        """Delete the files of iterations ``>= iterations_done`` (written after the checkpoint being restored)
        and any half-written temporary file; returns the deleted paths."""
        removed = []
        for name in sorted(os.listdir(self.directory)):
            m = self._PART.match(name)
            if m and (m.group(2) or int(m.group(1)) >= iterations_done):
                os.remove(os.path.join(self.directory, name))
                removed.append(name)
        return removed
