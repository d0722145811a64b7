"""DAPO's sampling recipes on completion records: the overlong penalty and the groups that carry no signal.

Pure Python on the driver's completion records (no Ray); the sampler (`rllib_p3o.driver.sampler`) applies them to
what the runners return, before advantages are computed.

Overlong shaping (DAPO, verl's ``overlong_buffer``): with ``L_max = max_tokens`` and a buffer of ``B`` tokens, a
model turn of ``L`` tokens adds

    R_len(L) = 0                          if L <= L_max - B
             = (L_max - B - L) / B        if L_max - B < L <= L_max      (0 down to -1, linearly)

times ``overlong_penalty`` to the completion's reward. A multi-turn episode is charged for its longest model turn
(each turn has its own ``max_tokens``), found from the record's loss mask.

Dynamic sampling (DAPO, verl's ``filter_groups``): a group whose rewards are all equal has advantage 0 everywhere
and adds nothing to the gradient; it is left out and more groups are sampled in its place.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from rllib_p3o.core.columns import Record

CompletionRecord = Dict[str, Any]


def overlong_penalty(length: int, max_tokens: int, buffer: int) -> float:
    """``R_len`` of a turn of ``length`` tokens (module docstring): 0 up to ``max_tokens - buffer``, then linearly
    down to -1 at ``max_tokens``."""
    if buffer <= 0:
        return 0.0
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    return max(-1.0, (start - length) / buffer)


def longest_model_turn(record: Mapping[str, Any]) -> int:
    """Tokens of the record's longest model turn: the completion's length, or in a multi-turn episode the longest
    run of model tokens (loss mask 1)."""
    mask = record.get(Record.LOSS_MASK)
    if mask is None:
        return len(record[Record.COMPLETION_IDS])
    longest = run = 0
    for m in np.asarray(mask).tolist():
        run = run + 1 if m else 0
        longest = max(longest, run)
    return longest


def apply_overlong_shaping(
    records: Sequence[CompletionRecord], max_tokens: int, buffer: int, penalty: float
) -> Tuple[float, float]:
    """Add ``penalty · R_len`` to each record's reward (NaN stays NaN). Returns ``(share of completions whose longest
    turn reached max_tokens, mean penalty added)``."""
    if not records:
        return 0.0, 0.0
    truncated = 0
    added = 0.0
    for r in records:
        length = longest_model_turn(r)
        truncated += length >= max_tokens
        shaping = penalty * overlong_penalty(length, max_tokens, buffer)
        if shaping:
            r[Record.REWARD] = float(r[Record.REWARD]) + shaping
            added += shaping
    return truncated / len(records), added / len(records)


def truncated_share(records: Sequence[CompletionRecord], max_tokens: int) -> float:
    """Share of completions whose longest model turn reached ``max_tokens`` (cut by the limit)."""
    return sum(longest_model_turn(r) >= max_tokens for r in records) / len(records) if records else 0.0


def group_has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's scored rewards differ (NaN, an unscorable completion, is left out)."""
    scored = [float(x) for x in rewards if not math.isnan(float(x))]
    return len(scored) >= 2 and max(scored) > min(scored)


def split_by_signal(records: Sequence[CompletionRecord]) -> Tuple[List[CompletionRecord], List[CompletionRecord]]:
    """``(records of groups with signal, records of groups without)``, each in the records' order."""
    by_group: Dict[int, List[float]] = {}
    for r in records:
        by_group.setdefault(int(r[Record.GROUP_ID]), []).append(r[Record.REWARD])
    signal = {g for g, rewards in by_group.items() if group_has_signal(rewards)}
    kept = [r for r in records if int(r[Record.GROUP_ID]) in signal]
    filtered = [r for r in records if int(r[Record.GROUP_ID]) not in signal]
    return kept, filtered


def group_ids(records: Sequence[CompletionRecord]) -> List[int]:
    """The records' group ids, each once, in order of first appearance."""
    return list(dict.fromkeys(int(r[Record.GROUP_ID]) for r in records))
