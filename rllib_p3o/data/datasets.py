"""Prompt datasets: what ``env_config["dataset"]`` (and ``eval_dataset``) may be, read into rows and checked.

A ``.parquet``/``.jsonl``/``.json`` path (local or a URI, `rllib_p3o.core.storage`), a list of dicts, a Hugging Face
``datasets.Dataset``, a Ray Data ``ray.data.Dataset`` or ``"module:function"`` (a function returning one of these).
Each row has at least ``prompt``: a string, or a list of chat messages rendered with the policy tokenizer's chat
template (`rllib_p3o.data.chat`); other columns (e.g. ``answer``) reach the reward functions as keyword lists.
Dataset objects are turned into rows once, on the driver (`materialize_dataset`), in their own order; the runners
read paths and lists themselves (`load_prompt_dataset`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from rllib_p3o.core import storage
from rllib_p3o.core.callables import BY_NAME as _BY_NAME
from rllib_p3o.core.callables import resolve_callable
from rllib_p3o.core.config_error import ConfigError
from rllib_p3o.data.chat import check_chat_template, is_conversational, message_problem

Row = Dict[str, Any]
# A path, rows, a Hugging Face `datasets.Dataset`, a `ray.data.Dataset` or "module:function" returning one of these.
DatasetSpec = Union[str, os.PathLike, Sequence[Mapping[str, Any]], Any]


class DatasetError(ConfigError):
    """A prompt dataset is missing, empty or malformed; the message names the file, row and column."""


def _object_kind(spec: Any) -> Optional[str]:
    """ "huggingface" or "ray" for the dataset objects `materialize_dataset` turns into rows, else None."""
    module = type(spec).__module__ or ""
    if module.startswith("datasets.") and hasattr(spec, "column_names"):
        return "huggingface"
    if module.startswith("ray.data.") and hasattr(spec, "to_arrow_refs"):
        return "ray"
    return None


def _ray_dataset_rows(ds: Any) -> List[Row]:
    """The rows of a ``ray.data.Dataset`` in the dataset's own order (``preserve_order``): every process that reads the
    rows must see the same order, since the prompt schedule (`rllib_p3o.data.prompt_schedule`) picks rows by index and
    a restored run must pick the same ones."""
    import pyarrow as pa
    import ray

    options = ds.context.execution_options
    preserve = options.preserve_order
    options.preserve_order = True
    try:
        tables = ray.get(ds.to_arrow_refs())
    finally:
        options.preserve_order = preserve
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables, promote_options="permissive").to_pylist() if tables else []


def materialize_datasets(env_config: Mapping[str, Any], keys: Sequence[str]) -> Mapping[str, Any]:
    """``env_config`` with each of ``keys`` that holds a dataset object (neither a path nor a list of rows) read into
    rows by `materialize_dataset`; ``env_config`` itself when none does."""
    for key in keys:
        value = env_config.get(key)
        if value is not None and not isinstance(value, (list, tuple, os.PathLike)):
            rows = materialize_dataset(value, key)
            if rows is not value:
                env_config = {**env_config, key: rows}
    return env_config


def materialize_dataset(spec: DatasetSpec, name: str = "dataset") -> DatasetSpec:
    """``spec`` with dataset objects turned into a list of row dicts: a Hugging Face ``datasets.Dataset`` (or
    ``IterableDataset``) and a ``ray.data.Dataset`` (read once, in order), and ``"module:function"`` (called, and its
    result turned into rows likewise). Paths and lists are returned as they are: the runners read those themselves.

    Runs on the driver, at config time, so that a Ray dataset executes outside any actor's reserved CPUs and every
    runner gets the same rows.
    """
    if isinstance(spec, str) and _BY_NAME.match(spec) and not os.path.exists(spec):
        try:
            fn = resolve_callable(spec, what=name)
        except (ImportError, AttributeError) as e:
            raise DatasetError(f"{name}: cannot import {spec!r}: {e}") from e
        try:
            spec = fn()
        except Exception as e:
            raise DatasetError(f"{name}: {spec} raised {type(e).__name__}: {e}") from e
        if isinstance(spec, str) and _BY_NAME.match(spec):
            raise DatasetError(f"{name}: the function returned another name, {spec!r}; return rows or a path")
        return materialize_dataset(spec, name)
    kind = _object_kind(spec)
    if kind == "huggingface" and type(spec).__name__ in ("DatasetDict", "IterableDatasetDict"):
        raise DatasetError(
            f"{name}: a DatasetDict holds several splits ({', '.join(spec)}); pass one, e.g. dataset['train']"
        )
    if kind == "huggingface":
        return [dict(r) for r in (spec.to_list() if hasattr(spec, "to_list") else spec)]
    if kind == "ray":
        return _ray_dataset_rows(spec)
    return spec


def read_prompt_rows(spec: DatasetSpec, name: str = "dataset") -> tuple:
    """``(rows, where)``: the raw rows of a prompt dataset (any `DatasetSpec`; a file is a local path or a URI,
    `rllib_p3o.core.storage`) and a name for messages (the file's path), unchecked. `DatasetError` when the file is missing, unreadable or empty."""
    spec = materialize_dataset(spec, name)
    if isinstance(spec, (str, os.PathLike)):
        try:
            location = storage.locate(spec)
            found, is_dir = location.exists(), location.is_dir()
        except storage.StorageError as e:
            raise DatasetError(f"{name}: {e}") from e
        path = where = str(location)
        if not found:
            raise DatasetError(f"{name}: file not found: {path}")
        if path.endswith(".parquet") or is_dir:
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(location.path, filesystem=location.filesystem).to_pylist()
            except Exception as e:
                raise DatasetError(f"{name}: cannot read Parquet {path}: {e}") from e
        elif path.endswith(".jsonl"):
            rows = []
            for i, line in enumerate(location.read_bytes().decode("utf-8").splitlines()):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{name}: {path} line {i + 1} is not valid JSON: {e}") from e
        elif path.endswith(".json"):
            try:
                rows = json.loads(location.read_bytes().decode("utf-8"))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{name}: {path} is not valid JSON: {e}") from e
            if not isinstance(rows, list):
                raise DatasetError(f"{name}: {path} must hold a JSON list of rows, got a {type(rows).__name__}")
        else:
            raise DatasetError(f"{name}: unsupported file type {path} (use .parquet, .jsonl or .json)")
    else:
        rows, where = list(spec), f"{name} (in-memory list)"
    if not rows:
        raise DatasetError(f"{where}: the dataset is empty")
    return rows, where


def prompt_row_problem(row: Any) -> Optional[str]:
    """What is wrong with one prompt row (``"row N" + this`` names it), or None when it is valid."""
    if not isinstance(row, Mapping):
        return f"is a {type(row).__name__}, expected a mapping with a 'prompt'"
    if "prompt" not in row:
        return f"has no 'prompt' column (columns: {sorted(row)})"
    prompt = row["prompt"]
    if is_conversational(prompt):
        problem = message_problem(prompt)
        return f"column 'prompt': {problem}" if problem else None
    if not isinstance(prompt, str) or not prompt:
        return f"column 'prompt' must be a non-empty string or a list of chat messages, got {prompt!r:.200}"
    return None


def load_prompt_dataset(spec: DatasetSpec, name: str = "dataset") -> List[Row]:
    """Rows of a prompt dataset (any `DatasetSpec`), validated: the first bad row raises `DatasetError` naming the
    file, the row and the column."""
    rows, where = read_prompt_rows(spec, name)
    for i, r in enumerate(rows):
        problem = prompt_row_problem(r)
        if problem:
            raise DatasetError(f"{where}: row {i} {problem}")
    return [dict(r) for r in rows]


def has_conversational_prompts(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(is_conversational(r.get("prompt")) for r in rows)


def dataset_is_conversational(spec: DatasetSpec) -> bool:
    """Whether a prompt dataset's prompts are chat messages, read cheaply (Parquet: the schema; JSONL: the first
    row) for config validation; the full check happens when the runners load the rows."""
    if not isinstance(spec, (str, os.PathLike)):
        return has_conversational_prompts([r for r in spec if isinstance(r, Mapping)])
    try:
        location = storage.locate(spec)
        path = str(location)
        if path.endswith(".parquet") or location.is_dir():
            import pyarrow as pa
            import pyarrow.dataset as ds

            dataset = ds.dataset(location.path, format="parquet", filesystem=location.filesystem)
            field = dataset.schema.field("prompt")
            return pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        if path.endswith(".jsonl"):
            with location.filesystem.open_input_stream(location.path) as f:
                head = b""
                while b"\n" not in head.lstrip() and (chunk := f.read(1 << 16)):
                    head += chunk
            first = next((line for line in head.decode("utf-8", "replace").splitlines() if line.strip()), "{}")
            return is_conversational(json.loads(first).get("prompt"))
    except (OSError, KeyError, ValueError):
        return False  # a missing or malformed file is reported, with its row, when it is loaded
    return False


def check_chat_dataset(env_config: Mapping[str, Any], model: str, trust_remote_code: bool = False) -> None:
    """`rllib_p3o.data.chat.ChatTemplateError` naming ``model`` when the prompt dataset is conversational and the model's
    tokenizer has no chat template (at config validation, before any actor starts)."""
    dataset = env_config.get("dataset")
    if dataset is None or not dataset_is_conversational(dataset):
        return
    from transformers import AutoTokenizer

    check_chat_template(AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code), model)
