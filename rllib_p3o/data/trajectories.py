"""Trajectory files (Parquet): the schema, its validator, and rows → completion records.

The RLlib side of reading them (Ray Data, prelearner) is `rllib_p3o.data.offline_data`.

Schema: one row per completion.

    column             type                required                          meaning
    prompt             string or messages  prompt or prompt_ids              prompt text, or chat messages
                                                                             (list<struct<role, content>>,
                                                                             rendered by the chat template)
    prompt_ids         list<int>           prompt or prompt_ids              prompt token ids (policy tokenizer)
    completion         string              completion or completion_ids      completion text
    completion_ids     list<int>           completion or completion_ids      completion token ids
    reward             float or null       yes                               verifier reward, finite; null (or
                                                                             NaN): unscored, left out of training
    behavior_logprobs  list<float>         yes (or rescore, see below)       log π_b of each completion token, ≤ 0
    group_id           int or string       group_id or advantage             rows of one prompt group
    advantage          float               group_id or advantage             used as-is when present
    policy_version     int                 no                                weights version (weights_seq_no) that
                                                                             sampled the row
    source             string              no                                data source that produced the row:
                                                                             "policy", "behavior/<name>", ...
    model_name         string              no                                the model that sampled the row
    model_fingerprint  string              no                                its weights' fingerprint: whether the
                                                                             row is the trained policy's own data or
                                                                             another model's (absent: another
                                                                             model's; `rllib_p3o.data.provenance`)
    temperature, top_p float               no                                sampling parameters
    loss_mask          list<int>           no                                multi-turn rows: 1 on model tokens,
                                                                             0 on environment tokens, one per
                                                                             completion token (absent: all 1)

Text-only rows are tokenized with the policy's tokenizer; rows that carry ids are checked against it (every id below
its vocabulary size). When a row has both, the ids are authoritative: sampled ids need not be the tokenizer's
canonical encoding of their decoded text, and they are what the behavior log-probs refer to. ``behavior_logprobs``
must have one entry per completion token. A multi-turn row's completion holds every token after the prompt, model
and environment turns as played; its ``loss_mask`` says which are the model's (only those are trained on and enter
the ESS; the behavior log-probs of environment tokens are placeholders, 0 as recorded). Rows without behavior
log-probs are an error unless ``offline_rescore_model`` names a model that scores them once; they are never silently
treated as on-policy.

Paths are local paths or URIs that pyarrow's filesystems open (``s3://...``, `rllib_p3o.core.storage`).
Online runs with ``record_rollouts=DIR`` write this same schema (`rllib_p3o.data.recorder`), one file per iteration,
written to a temporary name and renamed: a file is complete or absent, whatever happens to the run. Read back, a
row's source becomes ``offline/<source>`` (`rllib_p3o.core.sources.offline_source_name`).

Unscored rows: a completion no reward function scored (each returned None) is recorded with a null reward (earlier
recordings hold NaN there; it means the same). Such a row is valid and counted apart (`ValidationReport.unscored`):
offline training leaves it out and warns with the count (`rllib_p3o.data.offline_data`), as online training gives it
no advantage and leaves it out of its group's statistics.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from rllib_p3o.core import columns, storage
from rllib_p3o.core.columns import Record
from rllib_p3o.core.config_error import ConfigError
from rllib_p3o.core.sources import offline_source_name, source_id
from rllib_p3o.data.chat import has_chat_template, is_conversational, message_problem, prompt_token_ids
from rllib_p3o.data.provenance import RECORDER

PathSpec = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

REQUIRED_ONE_OF = (("prompt", "prompt_ids"), ("completion", "completion_ids"), ("group_id", "advantage"))
LIST_INT_COLUMNS = ("prompt_ids", "completion_ids")
LOSS_MASK = Record.LOSS_MASK
# On disk, a record's weights_seq_no is called policy_version (the schema's documented name).
POLICY_VERSION = next(f.file for f in columns.FIELDS if f.key == Record.WEIGHTS_SEQ_NO)
# A log-prob above this is a data error (float32 noise can make log 1 = 0 slightly positive).
MAX_LOGPROB = 1e-4


class OfflineDataError(ConfigError):
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
    files: List[str]  # paths or URIs, as `storage.locate` opens them again
    num_rows: int
    problems: List[Problem]
    locations: List[storage.Location] = dataclasses.field(default_factory=list, repr=False)
    # (file, row) of the unscored rows (reward null or NaN): valid, but left out of training.
    unscored: List[Tuple[str, int]] = dataclasses.field(default_factory=list)
    # Those of them whose reward is NaN, not null: named apart, since a NaN usually comes from a reward function's bug
    # (the recorder writes null for a completion no function scored; recordings before it wrote NaN).
    nan_rewards: List[Tuple[str, int]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_rows(self) -> int:
        return len({(p.file, p.row) for p in self.problems if p.row is not None})

    @property
    def skipped_rows(self) -> int:
        """Rows training leaves out: the unscored ones and, under ``offline_skip_bad_rows``, the bad ones."""
        return len({(p.file, p.row) for p in self.problems if p.row is not None} | set(self.unscored))

    def summary(self, limit: int = 50) -> str:
        head = f"{len(self.files)} file(s), {self.num_rows} row(s): " + ("OK" if self.ok else self._problem_count())
        nulls = len(self.unscored) - len(self.nan_rewards)
        if nulls:
            head += f"; {nulls} unscored (reward null: left out of training)"
        if self.nan_rewards:
            rows = ", ".join(f"{file} row {row}" for file, row in self.nan_rewards[:limit])
            more = f" and {len(self.nan_rewards) - limit} more" if len(self.nan_rewards) > limit else ""
            head += (
                f"; {len(self.nan_rewards)} with reward NaN ({rows}{more}): left out of training as unscored. A reward "
                "function that returns NaN has a bug; one that does not score a completion returns None (null)"
            )
        lines = [head] + [f"  {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        return "\n".join(lines)

    def _problem_count(self) -> str:
        """ "3 problem(s): 1 with whole file(s), 2 in 2 row(s)": a missing column is a problem of a whole file, in
        no row of it."""
        whole_files = sum(p.row is None for p in self.problems)
        in_rows = len(self.problems) - whole_files
        parts = [f"{whole_files} with whole file(s)"] * bool(whole_files)
        parts += [f"{in_rows} in {self.bad_rows} row(s)"] * bool(in_rows)
        if len(parts) == 1:
            return f"{len(self.problems)} problem(s) " + parts[0].split(" ", 1)[1]
        return f"{len(self.problems)} problem(s): " + ", ".join(parts)


def parquet_locations(paths: PathSpec, filesystem: Optional[Any] = None) -> List[storage.Location]:
    """Parquet files of a file, a directory (recursively, hidden names left out) or a list of those, each a local
    path or a URI (`rllib_p3o.core.storage`; on ``filesystem`` when given, e.g. RLlib's ``input_filesystem``);
    sorted per directory, never empty."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: List[storage.Location] = []
    for p in items:
        try:
            location = storage.locate(p, filesystem)
            if location.is_dir():
                files += location.list_files(".parquet", recursive=True)
            elif location.exists():
                files.append(location)
            else:
                raise OfflineDataError(f"{location}: no such file or directory")
        except storage.StorageError as e:
            raise OfflineDataError(str(e)) from e
    if not files:
        raise OfflineDataError(f"{[os.fspath(p) for p in items]}: no Parquet files found (the dataset is empty)")
    return files


def list_parquet_files(paths: PathSpec, filesystem: Optional[Any] = None) -> List[str]:
    """`parquet_locations` as paths or URIs (local paths absolute)."""
    return [location.uri for location in parquet_locations(paths, filesystem)]


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def is_nan(reward: Any) -> bool:
    """Whether a reward is a float NaN (not a null)."""
    return isinstance(reward, (float, np.floating)) and math.isnan(reward)


def unscored(reward: Any) -> bool:
    """Whether a row's reward says that no reward function scored it: null (None), or NaN (older recordings, and how
    Ray Data's numpy batches read a null)."""
    return reward is None or is_nan(reward)


def check_row(
    row: Mapping[str, Any],
    *,
    vocab_size: Optional[int] = None,
    tokenizer=None,
    require_behavior: bool = True,
    max_seq_len: Optional[int] = None,
) -> List[tuple]:
    """Problems of one row as ``(column, message)`` pairs; empty when the row is valid."""
    out = _missing_columns(row) + _bad_numbers(row) + _bad_prompt(row, tokenizer) + _bad_completion_text(row)
    out += _bad_token_ids(row, vocab_size)
    n_completion = _completion_length(row, tokenizer)
    out += _bad_length(row, tokenizer, n_completion, max_seq_len)
    out += _bad_loss_mask(row, n_completion)
    out += _bad_behavior_logprobs(row, n_completion, require_behavior)
    return out


def _missing_columns(row: Mapping[str, Any]) -> List[tuple]:
    """Each required pair (`REQUIRED_ONE_OF`) with neither column set."""
    return [
        (f"{a}/{b}", f"needs '{a}' or '{b}'") for a, b in REQUIRED_ONE_OF if row.get(a) is None and row.get(b) is None
    ]


def _bad_numbers(row: Mapping[str, Any]) -> List[tuple]:
    """The reward (required) and the optional advantage and sampling parameters, each a finite number."""
    out: List[tuple] = []
    reward = row.get("reward")
    if not unscored(reward) and not _finite(reward):  # null or NaN: an unscored row, valid (module docstring)
        out.append(("reward", f"must be a finite number or null, got {reward!r}"))
    for col in ("advantage", "temperature", "top_p"):
        if row.get(col) is not None and not _finite(row[col]):
            out.append((col, f"must be a finite number, got {row[col]!r}"))
    return out


def _bad_prompt(row: Mapping[str, Any], tokenizer) -> List[tuple]:
    """A prompt is a string or well-formed chat messages, and messages need ids or a tokenizer with a template."""
    prompt = row.get("prompt")
    if is_conversational(prompt):
        problem = message_problem(prompt)
        if problem:
            return [("prompt", problem)]
        if row.get("prompt_ids") is None and tokenizer is not None and not has_chat_template(tokenizer):
            return [
                (
                    "prompt",
                    "chat messages, but the policy's tokenizer has no chat template (give prompt_ids "
                    "or string prompts)",
                )
            ]
    elif prompt is not None and not isinstance(prompt, str):
        return [("prompt", f"must be a string or a list of chat messages, got {type(prompt).__name__}")]
    return []


def _bad_completion_text(row: Mapping[str, Any]) -> List[tuple]:
    if row.get("completion") is not None and not isinstance(row["completion"], str):
        return [("completion", f"must be a string, got {type(row['completion']).__name__}")]
    return []


def _bad_token_ids(row: Mapping[str, Any], vocab_size: Optional[int]) -> List[tuple]:
    """Token id columns (`LIST_INT_COLUMNS`): lists of integers in ``[0, vocab_size)``."""
    out: List[tuple] = []
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
    return out


def _bad_length(
    row: Mapping[str, Any], tokenizer, n_completion: Optional[int], max_seq_len: Optional[int]
) -> List[tuple]:
    """An empty completion, or prompt + completion longer than ``max_seq_len``."""
    out: List[tuple] = []
    if n_completion == 0:
        out.append(("completion", "empty completion"))
    if max_seq_len is not None and n_completion:
        n_prompt = _prompt_length(row, tokenizer)
        if n_prompt is not None and n_prompt + n_completion > max_seq_len:
            out.append(
                (
                    "completion",
                    f"prompt + completion = {n_prompt + n_completion} tokens, more than "
                    f"offline_max_seq_len={max_seq_len}",
                )
            )
    return out


def _bad_loss_mask(row: Mapping[str, Any], n_completion: Optional[int]) -> List[tuple]:
    """A loss mask (multi-turn rows) holds 0/1 integers, at least one 1, one per completion token."""
    mask = loss_mask(row)
    if mask is None:
        return []
    try:
        mask = [int(v) for v in mask]
    except (TypeError, ValueError):
        return [(LOSS_MASK, "must be a list of 0/1 integers")]
    out: List[tuple] = []
    if any(v not in (0, 1) for v in mask):
        out.append((LOSS_MASK, "must hold only 0 and 1"))
    elif not any(mask):
        out.append((LOSS_MASK, "has no model token (all 0): nothing to train on"))
    if n_completion is not None and len(mask) != n_completion:
        out.append((LOSS_MASK, f"has {len(mask)} entries for {n_completion} completion tokens"))
    return out


def _bad_behavior_logprobs(row: Mapping[str, Any], n_completion: Optional[int], require_behavior: bool) -> List[tuple]:
    """Behavior log-probs: present unless rows are rescored, one finite value <= `MAX_LOGPROB` per completion
    token."""
    lps = row.get("behavior_logprobs")
    if lps is None:
        if require_behavior:
            return [
                (
                    "behavior_logprobs",
                    "missing (set offline_rescore_model to score such rows, never treat them as on-policy)",
                )
            ]
        return []
    try:
        values = [float(v) for v in lps]
    except (TypeError, ValueError):
        return [("behavior_logprobs", "must be a list of floats")]
    out: List[tuple] = []
    if n_completion is not None and len(values) != n_completion:
        out.append(("behavior_logprobs", f"has {len(values)} entries for {n_completion} completion tokens"))
    if not all(math.isfinite(v) for v in values):
        out.append(("behavior_logprobs", "non-finite log-prob"))
    elif any(v > MAX_LOGPROB for v in values):
        out.append(("behavior_logprobs", f"positive log-prob {max(values):.4g}"))
    return out


def loss_mask(row: Mapping[str, Any]) -> Optional[Any]:
    """A row's loss mask, or None where it has none (a column of nulls reads as NaN in Ray Data's numpy batches)."""
    mask = row.get(LOSS_MASK)
    if mask is None or (isinstance(mask, (float, np.floating)) and math.isnan(mask)):
        return None
    return mask


def _tokenize(tokenizer, text: str, column: str) -> List[int]:
    # Completions continue the prompt: no special tokens (BOS) in front of them.
    return tokenizer(text, add_special_tokens=(column == "prompt"))["input_ids"]


def _prompt_length(row: Mapping[str, Any], tokenizer) -> Optional[int]:
    if row.get("prompt_ids") is not None:
        return len(row["prompt_ids"])
    prompt = row.get("prompt")
    if tokenizer is None:
        return None
    if isinstance(prompt, str):
        return len(_tokenize(tokenizer, prompt, "prompt"))
    if is_conversational(prompt) and message_problem(prompt) is None and has_chat_template(tokenizer):
        return len(prompt_token_ids(tokenizer, list(prompt)))
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


def validate_trajectories(
    paths: PathSpec,
    *,
    filesystem: Optional[Any] = None,
    tokenizer=None,
    vocab_size: Optional[int] = None,
    require_behavior: bool = True,
    max_seq_len: Optional[int] = None,
) -> ValidationReport:
    """Check every file and row of a trajectory dataset against the schema (see module docstring). ``paths`` are
    local paths or URIs (`parquet_locations`)."""
    locations = parquet_locations(paths, filesystem)
    if tokenizer is not None and vocab_size is None:
        vocab_size = len(tokenizer)
    problems: List[Problem] = []
    unscored_rows: List[Tuple[str, int]] = []
    nan_rows: List[Tuple[str, int]] = []
    num_rows = 0
    for location in locations:
        f = str(location)
        try:
            table = read_table(location)
        except Exception as e:
            problems.append(Problem(f, None, None, f"cannot read Parquet: {e}"))
            continue
        problem = missing_columns_problem(table.column_names, require_behavior)
        if problem:
            problems.append(Problem(f, None, None, problem))
            num_rows += table.num_rows
            continue
        for i, row in enumerate(table.to_pylist()):
            if unscored(row.get("reward")):
                unscored_rows.append((f, i))
                if is_nan(row.get("reward")):
                    nan_rows.append((f, i))
            for column, message in check_row(
                row,
                vocab_size=vocab_size,
                tokenizer=tokenizer,
                require_behavior=require_behavior,
                max_seq_len=max_seq_len,
            ):
                problems.append(Problem(f, i, column, message))
        num_rows += table.num_rows
    if num_rows == 0 and not problems:
        problems.append(Problem(", ".join(map(str, locations)), None, None, "the dataset has no rows"))
    return ValidationReport(
        files=[location.uri for location in locations],
        num_rows=num_rows,
        problems=problems,
        locations=locations,
        unscored=unscored_rows,
        nan_rewards=nan_rows,
    )


def missing_columns_problem(column_names: Sequence[str], require_behavior: bool = True) -> Optional[str]:
    """What a file's schema lacks of the required columns (`REQUIRED_ONE_OF`, ``reward``, and ``behavior_logprobs``
    unless ``require_behavior`` is False), with the fix; None when nothing is missing."""
    names = set(column_names)
    missing = [f"'{a}' or '{b}'" for a, b in REQUIRED_ONE_OF if a not in names and b not in names]
    missing += [f"'{c}'" for c in ("reward",) if c not in names]
    if require_behavior and "behavior_logprobs" not in names:
        missing.append("'behavior_logprobs'")
    if not missing:
        return None
    fix = (
        " (record the sampling policy's log-probs with the data, or set offline_rescore_model=MODEL to score them once)"
        if missing == ["'behavior_logprobs'"]
        else ""
    )
    return "missing required column(s): " + ", ".join(missing) + fix


def schema_problems(
    paths: PathSpec, *, filesystem: Optional[Any] = None, require_behavior: bool = True
) -> List[Problem]:
    """`missing_columns_problem` of every file of a trajectory dataset, from the files' schemas alone (their rows are
    not read): a check cheap enough to run on the driver before a trial starts (`rllib_p3o.driver.preflight`)."""
    import pyarrow.parquet as pq

    problems = []
    for location in parquet_locations(paths, filesystem):
        try:
            names = pq.read_schema(location.path, filesystem=location.filesystem).names
        except Exception as e:
            problems.append(Problem(str(location), None, None, f"cannot read Parquet: {e}"))
            continue
        problem = missing_columns_problem(names, require_behavior)
        if problem:
            problems.append(Problem(str(location), None, None, problem))
    return problems


def read_table(location: storage.Location, columns: Optional[List[str]] = None):
    """One Parquet file (a `storage.Location`) as a pyarrow table."""
    import pyarrow.parquet as pq

    return pq.read_table(location.path, columns=columns, filesystem=location.filesystem)


def row_to_record(row: Mapping[str, Any], tokenizer) -> Dict[str, Any]:
    """A validated row as a completion record (`rllib_p3o.core.columns.Record`), tokenizing text-only columns.

    The row's source becomes ``offline/<source>``, or ``offline/behavior/<recorder>`` where `P3OOfflineData` found
    another model wrote it (its `rllib_p3o.data.provenance.RECORDER` key; `rllib_p3o.core.sources.offline_source_name`).
    """
    prompt_ids = row.get("prompt_ids")
    if prompt_ids is None:
        prompt = row["prompt"]
        prompt_ids = (
            prompt_token_ids(tokenizer, list(prompt))
            if is_conversational(prompt)
            else _tokenize(tokenizer, prompt, "prompt")
        )
    completion_ids = row.get("completion_ids")
    if completion_ids is None:
        completion_ids = _tokenize(tokenizer, row["completion"], "completion")
    record = {
        Record.PROMPT_IDS: np.asarray(prompt_ids, dtype=np.int64),
        Record.COMPLETION_IDS: np.asarray(completion_ids, dtype=np.int64),
        Record.REWARD: float(row["reward"]),
        # Every declared field with a trajectory column (`rllib_p3o.core.columns.FIELDS`); required ones must be there.
        **{
            f.key: columns.from_file(f, row[f.file] if f.default is None and not f.nullable else row.get(f.file))
            for f in columns.FIELDS
            if f.file
        },
        Record.SOURCE_ID: source_id(offline_source_name(row.get("source"), row.get(RECORDER))),
    }
    mask = loss_mask(row)
    if mask is not None:
        record[Record.LOSS_MASK] = np.asarray(mask, dtype=np.int8)
    return record
