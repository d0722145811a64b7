"""Rows of a right-padded batch packed end to end into fewer rows, with position ids that restart at each row.

A padded batch computes ``rows · longest`` token positions; packed, the same real tokens fill ``bins · width``
positions, with little padding left (first-fit decreasing: rows by length, longest first, each into the first
packed row with room). Each packed row holds several sequences one after the other; their position ids restart at
0 where each sequence starts, so rotary (or learned) positions are those of the row alone, and the attention backend
keeps each sequence to itself:

- ``sdpa``, ``eager``, ``flex_attention``: transformers (``masking_utils.find_packed_sequence_indices``) reads
  the restarts from the position ids when no attention mask is given and builds a block-diagonal causal mask;
- ``flash_attention_2``/``_3``: the varlen kernel, from the same position ids, when the batch is one packed row
  (`pack_capacity` then puts every row into one).

Each token's log-prob then depends on its own row alone, so the unpacked outputs equal those of the padded batch
(`unpack_token_values`); whether the installed model and backend really do this is checked on the model itself
before packing is used (`rllib_p3o.learner.compute.TokenLogprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

# Attention implementations whose packed input is one row of every sequence (the varlen kernel reads sequence starts
# from the position ids only for a batch of one row).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
# Attention implementations that take a block-diagonal mask built from restarting position ids.
MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")


@dataclass(frozen=True)
class PackPlan:
    """Row ``i`` of the batch (``lengths[i]`` real tokens) goes to packed row ``packed_row[i]`` from position
    ``offset[i]``; the packed batch is ``num_packed × width``."""

    lengths: np.ndarray
    packed_row: np.ndarray
    offset: np.ndarray
    num_packed: int
    width: int

    @property
    def token_positions(self) -> int:
        """Positions the packed forward computes: ``num_packed · width``."""
        return self.num_packed * self.width


def pack_capacity(lengths: Sequence[int], attn_implementation: str) -> int:
    """Width of a packed row: the longest row (so a packed row's attention never costs more than a padded row's),
    or every row's tokens in one packed row for the varlen kernels (`VARLEN_ATTENTION`)."""
    lengths = np.asarray(lengths)
    return int(lengths.sum()) if attn_implementation in VARLEN_ATTENTION else int(lengths.max())


def plan_packing(lengths: Sequence[int], capacity: int) -> PackPlan:
    """First-fit decreasing of rows of ``lengths`` into packed rows of ``capacity`` positions.

    Every row fits (``capacity >= max(lengths)``); the packed width is the fullest packed row's fill."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and capacity < lengths.max():
        raise ValueError(f"pack capacity {capacity} is shorter than the longest row ({lengths.max()})")
    fill: List[int] = []
    packed_row = np.zeros(len(lengths), dtype=np.int64)
    offset = np.zeros(len(lengths), dtype=np.int64)
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        for b, used in enumerate(fill):
            if used + n <= capacity:
                break
        else:
            b = len(fill)
            fill.append(0)
        packed_row[i], offset[i] = b, fill[b]
        fill[b] += n
    return PackPlan(lengths, packed_row, offset, len(fill), max(fill, default=0))


def _token_index(plan: PackPlan, row_width: int, packed_width: int, shorten: int) -> Tuple[np.ndarray, np.ndarray]:
    """Flat indices of each row's first ``length - shorten`` positions: in the padded batch of ``row_width`` columns
    and in the packed batch of ``packed_width`` columns."""
    counts = np.maximum(plan.lengths - shorten, 0)
    rows = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    padded = rows * row_width + within
    packed = plan.packed_row[rows] * packed_width + plan.offset[rows] + within
    return padded, packed


def pack_rows(input_ids: torch.Tensor, plan: PackPlan) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(packed_ids, position_ids)``, both ``[num_packed, width]``: each row's real tokens at its offset, position
    ids restarting at 0 with each row. Positions after a packed row's last sequence hold token 0 and continue that
    sequence's positions (they come after every real token, so causal attention never lets a real token see them)."""
    rows, row_width = input_ids.shape
    padded, packed = _token_index(plan, row_width, plan.width, shorten=0)
    device = input_ids.device
    padded_t, packed_t = torch.as_tensor(padded, device=device), torch.as_tensor(packed, device=device)
    ids = input_ids.new_zeros(plan.num_packed * plan.width)
    ids[packed_t] = input_ids.reshape(-1)[padded_t]
    positions = np.tile(np.arange(plan.width, dtype=np.int64), plan.num_packed)  # the tail continues a sequence
    positions[packed] = padded % row_width
    for b in range(plan.num_packed):  # after the last sequence of a packed row: count on from its last position
        last = np.flatnonzero(plan.packed_row == b)
        end = int((plan.offset[last] + plan.lengths[last]).max())
        if end < plan.width:
            start = int(plan.offset[last].max())  # where the packed row's last sequence starts
            positions[b * plan.width + end : (b + 1) * plan.width] = np.arange(end - start, plan.width - start)
    return ids.view(plan.num_packed, plan.width), torch.as_tensor(positions, device=device).view(plan.num_packed, -1)


def pack_target_values(values: torch.Tensor, plan: PackPlan, fill: int = 0) -> torch.Tensor:
    """Per-target values of the batch's rows ``[rows, row_width - 1, ...]`` into the packed batch's target positions
    ``[num_packed, width - 1, ...]`` (the inverse of `unpack_token_values`; ``fill`` elsewhere)."""
    rows, targets = values.shape[:2]
    padded, packed = _token_index(plan, targets, plan.width - 1, shorten=1)
    device = values.device
    flat = values.reshape(rows * targets, *values.shape[2:])
    out = values.new_full((plan.num_packed * (plan.width - 1), *values.shape[2:]), fill)
    out[torch.as_tensor(packed, device=device)] = flat[torch.as_tensor(padded, device=device)]
    return out.view(plan.num_packed, plan.width - 1, *values.shape[2:])


def unpack_token_values(values: torch.Tensor, plan: PackPlan, row_width: int) -> torch.Tensor:
    """Per-target values of the packed batch ``[num_packed, width - 1]`` (position ``p`` scores token ``p + 1``) back
    to the batch's rows ``[rows, row_width - 1]``: row ``i``'s targets ``0 .. length_i - 2``, zeros after them.
    Differentiable (an index-select and an index-copy)."""
    padded, packed = _token_index(plan, row_width - 1, values.shape[1], shorten=1)
    device = values.device
    picked = values.reshape(-1).index_select(0, torch.as_tensor(packed, device=device))
    out = values.new_zeros(len(plan.lengths) * (row_width - 1))
    return out.index_copy(0, torch.as_tensor(padded, device=device), picked).view(len(plan.lengths), row_width - 1)
