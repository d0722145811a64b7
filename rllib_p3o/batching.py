"""Completions (from episodes or Parquet rows) → one right-padded token batch for the learner.

A *completion record* is a mapping with ``prompt_ids`` and ``completion_ids`` (int sequences), ``behavior_logprobs``
(one float per completion token: log π_b of that token) and ``advantage`` (float); optionally ``weights_seq_no``
and ``source_id`` (ints). Online episodes and offline rows are both turned into records, then into a batch here,
so the learner sees one format whatever the data came from.

Alignment: targets are ``input_ids[:, 1:]``, so completion token ``j`` of a row with prompt length ``P`` sits at
target position ``P - 1 + j``; ``completion_mask`` and ``behavior_logprobs`` are laid out on those positions.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

import numpy as np

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch


COLUMNS = ("input_ids", "attention_mask", "completion_mask", "behavior_logprobs", "advantages", "weights_seq_no",
           "source_id", "staleness")


def pad_records(records: Sequence[Mapping], pad_id: int, pad_to: Optional[int] = None) -> dict:
    """Stack completion records into numpy arrays padded to the longest row (or ``pad_to``)."""
    if not records:
        raise ValueError("pad_records got no completion records.")
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records]
    width = max(lengths)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"a row has {width} tokens, more than pad_to={pad_to}")
        width = pad_to
    b = len(records)
    input_ids = np.full((b, width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((b, width), dtype=np.int64)
    completion_mask = np.zeros((b, width - 1), dtype=np.float32)
    behavior = np.zeros((b, width - 1), dtype=np.float32)
    for i, r in enumerate(records):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        if len(r["behavior_logprobs"]) != c:
            raise ValueError(f"record {i}: {len(r['behavior_logprobs'])} behavior log-probs for {c} completion tokens")
        input_ids[i, :p] = r["prompt_ids"]
        input_ids[i, p:p + c] = r["completion_ids"]
        attention_mask[i, :p + c] = 1
        completion_mask[i, p - 1:p - 1 + c] = 1.0
        behavior[i, p - 1:p - 1 + c] = r["behavior_logprobs"]
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "behavior_logprobs": behavior,
        "advantages": np.asarray([r["advantage"] for r in records], dtype=np.float32),
        "weights_seq_no": np.asarray([r.get("weights_seq_no", 0) for r in records], dtype=np.int64),
        "source_id": np.asarray([r.get("source_id", 0) for r in records], dtype=np.int64),
        # Policy versions between the sampler and the learner (-1: not applicable, e.g. offline or behavior rows).
        "staleness": np.asarray([r.get("staleness", -1) for r in records], dtype=np.int64),
    }
    return out


def pad_rows_to_multiple(batch: dict, multiple: int) -> dict:
    """Append all-masked filler rows so the row count divides by ``multiple``.

    RLlib shards a batch contiguously across learners and each learner must run the same number of optimizer
    steps (the loss all-reduces inside). Filler rows have no valid token, so they change neither ESS, nor the
    token count, nor the gradient.
    """
    b = len(batch["input_ids"])
    extra = (-b) % multiple
    if extra == 0:
        return batch
    out = {}
    for k, v in batch.items():
        filler = np.repeat(v[:1], extra, axis=0)
        if k in ("completion_mask", "advantages"):
            filler = np.zeros_like(filler)
        out[k] = np.concatenate([v, filler])
    return out


def shuffle_rows(batch: dict, rng: np.random.Generator) -> dict:
    """One permutation for all columns (shards are contiguous slices: mix sources across learners)."""
    perm = rng.permutation(len(batch["input_ids"]))
    return {k: v[perm] for k, v in batch.items()}


def to_multi_agent_batch(batch: dict, module_id: str = DEFAULT_MODULE_ID) -> MultiAgentBatch:
    n = len(batch["input_ids"])
    return MultiAgentBatch({module_id: SampleBatch(batch)}, env_steps=n)


def concat_padded(batches: List[dict], pad_id: int) -> dict:
    """Concatenate padded batches of different widths, re-padding each to the widest."""
    if len(batches) == 1:
        return batches[0]
    width = max(b["input_ids"].shape[1] for b in batches)
    out = {}
    for k in COLUMNS:
        parts = []
        for b in batches:
            v = b[k]
            if v.ndim == 2:
                target = width if k in ("input_ids", "attention_mask") else width - 1
                v = np.pad(v, ((0, 0), (0, target - v.shape[1])), constant_values=pad_id if k == "input_ids" else 0)
            parts.append(v)
        out[k] = np.concatenate(parts)
    return out
