"""Completion records (from episodes or trajectory rows) → the learner's right-padded token batch.

Online episodes and offline rows both become completion records first (`rllib_p3o.core.columns.Record`), so the learner
sees one format whatever the data came from; `rllib_p3o.core.columns` gives the batch layout. One training batch:

1. online records → `pad_records` (to the longest row); offline rows → `pad_records` in the prelearner, to a fixed
   width (Ray Data needs fixed shapes);
2. `concat_padded`: every part cut or padded to the longest real row of all parts, in one step;
3. `shuffle_rows` (learner shards are contiguous slices) → `pad_rows_to_multiple` → `to_multi_agent_batch`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_p3o.core import columns
from rllib_p3o.core.batch_stats import group_advantages
from rllib_p3o.core.columns import ROW, TOKEN, Columns, Record

Batch = Dict[str, np.ndarray]

# Width of a batch without any real row: one input token, one target position.
MIN_WIDTH = 2


def add_group_advantages(records: Sequence[Dict[str, Any]]) -> None:
    """Set each record's advantage to its reward's z-score within its prompt group (`rllib_p3o.core.batch_stats.group_advantages`).

    Computed on the whole set of records, before any sharding across learners: a group must be normalized whole.
    """
    rewards = torch.tensor([r[Record.REWARD] for r in records], dtype=torch.float32)
    groups = torch.tensor([r[Record.GROUP_ID] for r in records], dtype=torch.long)
    for r, a in zip(records, group_advantages(rewards, groups).tolist()):
        r[Record.ADVANTAGE] = a


def _ragged() -> Dict[str, int]:
    """The ragged per-token batch columns (`rllib_p3o.core.columns.Field.ragged`) and their padding value."""
    return {f.batch: columns.KEPT_PAD for f in columns.FIELDS if f.batch and f.ragged}


def _zeros(rows: int, width: int, ragged_width: int = 0) -> Batch:
    token, target, row, dtypes = columns.batch_layout(columns.FIELDS)
    ragged = _ragged()
    shapes = {
        **{k: (rows, width) for k in token},
        **{k: (rows, width - 1) + ((ragged_width,) if k in ragged else ()) for k in target},
        **{k: (rows,) for k in row},
    }
    return {k: np.full(shapes[k], ragged.get(k, 0), dtypes[k]) for k in shapes}


def empty_batch(width: int) -> Batch:
    """A batch of 0 rows at token width ``width``."""
    return _zeros(0, width)


def pad_records(records: Sequence[Mapping[str, Any]], pad_id: int, pad_to: Optional[int] = None) -> Batch:
    """Stack completion records into a batch padded to the longest row (or to ``pad_to`` tokens).

    Every declared field with a batch column (`rllib_p3o.core.columns.FIELDS`) is filled from the records: per-token
    fields at the completion's target positions, per-row fields as they are, its ``default`` where a record lacks
    it (weights version 0, source 0, staleness -1).
    """
    if not records:
        raise ValueError("pad_records got no completion records.")
    lengths = [len(r[Record.PROMPT_IDS]) + len(r[Record.COMPLETION_IDS]) for r in records]
    width = max(lengths)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"a row has {width} tokens, more than pad_to={pad_to}")
        width = pad_to
    fields = [f for f in columns.FIELDS if f.batch]
    per_token = [f for f in fields if f.per == TOKEN and not f.ragged]
    ragged = [f for f in fields if f.ragged]
    ragged_width = max((np.shape(r[f.key])[-1] for f in ragged for r in records if r.get(f.key) is not None), default=0)
    out = _zeros(len(records), width, ragged_width)
    out[Columns.INPUT_IDS].fill(pad_id)
    for i, r in enumerate(records):
        p, c = len(r[Record.PROMPT_IDS]), len(r[Record.COMPLETION_IDS])
        out[Columns.INPUT_IDS][i, :p] = r[Record.PROMPT_IDS]
        out[Columns.INPUT_IDS][i, p : p + c] = r[Record.COMPLETION_IDS]
        out[Columns.ATTENTION_MASK][i, : p + c] = 1
        loss_mask = r.get(Record.LOSS_MASK)
        if loss_mask is None:
            out[Columns.COMPLETION_MASK][i, p - 1 : p - 1 + c] = 1.0
        elif len(loss_mask) != c:
            raise ValueError(f"record {i}: loss mask of {len(loss_mask)} entries for {c} completion tokens")
        else:  # multi-turn: environment tokens are context, not trained on
            out[Columns.COMPLETION_MASK][i, p - 1 : p - 1 + c] = loss_mask
        for f in per_token:
            values = r.get(f.key)
            if values is None:
                if f.fallback is not None:  # left out: the record's row field at every token
                    values = np.full(c, r.get(f.fallback, _default(f.fallback)))
                else:
                    values = r[f.key] if f.default is None else np.full(c, f.default)
            if len(values) != c:
                raise ValueError(f"record {i}: {len(values)} {f.what} for {c} completion tokens")
            out[f.batch][i, p - 1 : p - 1 + c] = values
        for f in ragged:  # a [c, w] array (w <= the batch's width), or nothing: padding only
            values = r.get(f.key)
            if values is None or np.size(values) == 0:
                continue
            if len(values) != c:
                raise ValueError(f"record {i}: {len(values)} {f.what} for {c} completion tokens")
            values = columns.ragged_array(values, c, f.dtype)
            out[f.batch][i, p - 1 : p - 1 + c, : values.shape[1]] = values
    for f in fields:
        if f.per == ROW:
            values = [r[f.key] for r in records] if f.default is None else [r.get(f.key, f.default) for r in records]
            out[f.batch] = np.asarray(values, dtype=f.dtype)
    return out


def _default(key: str) -> Any:
    """The declared default of the field ``key`` (`rllib_p3o.core.columns.FIELDS`)."""
    return next(f.default for f in columns.FIELDS if f.key == key)


def real_width(batch: Mapping[str, np.ndarray]) -> int:
    """Token width of the longest real row: one past the last position any row attends to (MIN_WIDTH if none)."""
    attended = np.nonzero(batch[Columns.ATTENTION_MASK].any(0))[0]
    return int(attended[-1]) + 1 if len(attended) else MIN_WIDTH


def fit_width(batch: Mapping[str, np.ndarray], width: int, pad_id: int) -> Batch:
    """The batch at token width ``width``: token columns cut or padded to ``width``, target columns to ``width - 1``
    (padding: ``pad_id`` in input_ids, 0 elsewhere). Only ever cut columns that are padding in every row."""
    token, target_columns, row, _ = columns.batch_layout(columns.FIELDS)
    ragged = _ragged()
    out = {}
    for k in (*token, *target_columns, *row):
        v = batch[k]
        if k in token or k in target_columns:
            target = width if k in token else width - 1
            if v.shape[1] >= target:
                v = v[:, :target]
            else:
                fill = pad_id if k == Columns.INPUT_IDS else ragged.get(k, 0)
                pad = [(0, 0), (0, target - v.shape[1])] + [(0, 0)] * (v.ndim - 2)
                v = np.pad(v, pad, constant_values=fill)
        out[k] = v
    return out


def concat_padded(batches: List[Mapping[str, np.ndarray]], pad_id: int) -> Batch:
    """Concatenate batches (online and offline parts) at the width of the longest real row among them (and the
    ragged columns at their widest)."""
    width = max(real_width(b) for b in batches)
    parts = [fit_width(b, width, pad_id) for b in batches]
    if len(parts) == 1:
        return parts[0]
    for k, fill in _ragged().items():
        widest = max(p[k].shape[2] for p in parts)
        for p in parts:
            p[k] = np.pad(p[k], ((0, 0), (0, 0), (0, widest - p[k].shape[2])), constant_values=fill)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def shuffle_rows(batch: Mapping[str, np.ndarray], rng: np.random.Generator) -> Batch:
    """One permutation for all columns (shards are contiguous slices: mix sources across learners)."""
    perm = rng.permutation(len(batch[Columns.INPUT_IDS]))
    return {k: v[perm] for k, v in batch.items()}


def pad_rows_to_multiple(batch: Batch, multiple: int) -> Batch:
    """Append all-masked filler rows so the row count divides by ``multiple``.

    RLlib shards a batch contiguously across learners and each learner must run the same number of optimizer
    steps (the loss all-reduces inside). Filler rows have no valid token, so they change neither ESS, nor the
    token count, nor the gradient.
    """
    b = len(batch[Columns.INPUT_IDS])
    extra = (-b) % multiple
    if extra == 0:
        return batch
    out = {}
    for k, v in batch.items():
        filler = np.repeat(v[:1], extra, axis=0)
        if k in (Columns.COMPLETION_MASK, Columns.ADVANTAGES):
            filler = np.zeros_like(filler)
        out[k] = np.concatenate([v, filler])
    return out


def to_multi_agent_batch(batch: Mapping[str, np.ndarray], module_id: str = DEFAULT_MODULE_ID) -> MultiAgentBatch:
    """The batch as RLlib's `MultiAgentBatch` for ``learner_group.update(batch=...)``."""
    return MultiAgentBatch({module_id: SampleBatch(dict(batch))}, env_steps=len(batch[Columns.INPUT_IDS]))
