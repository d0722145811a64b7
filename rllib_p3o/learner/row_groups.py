"""Which rows of a minibatch a loss treats alike: their lag behind the current weights, whether a trust region acts
on them, and their ESS group. Pure torch (the learner calls these on every minibatch; tests call them without Ray).

- **lag**: optimizer steps between the weights that sampled a row and the current weights: the row's staleness when
  the update began (async: policy versions behind) plus the optimizer steps this update has applied since (a batch's
  second minibatch, or second epoch, is one step behind). -1 where it is not known: offline rows and another model's
  rows carry no version of this policy.
- **lagging**: the policy's own rows with lag ≥ 1, and offline rows that are not another model's (their lag is
  unknown, but not 0). Never another model's rows. Trust regions (`rllib_p3o.core.losses.trust_region`) act on these.
- **ESS groups** (``ess_scope``): "batch": none (one ESS); "source": one group per source; "version": one per
  (source, lag) pair. Numbered over the union of the groups on all learners, so every learner runs the same
  collectives.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from rllib_p3o.core.sources import POLICY_SOURCE_ID

# A (source, lag) pair as one integer: source ids are < 2^31 and lags small, so the pair packs into an int64.
_LAG_SLOTS = 1 << 20


def row_lag(staleness: torch.Tensor, steps_in_update: int) -> torch.Tensor:
    """[B] ``staleness + steps_in_update`` where the staleness is known (>= 0), -1 elsewhere."""
    staleness = staleness.long()
    return torch.where(staleness >= 0, staleness + int(steps_in_update), staleness)


def other_model_rows(source: torch.Tensor, other_model_ids: Sequence[int]) -> torch.Tensor:
    """[B] bool: rows whose source is another model's (`rllib_p3o.core.sources.other_model_source_ids`)."""
    ids = torch.as_tensor(list(other_model_ids), dtype=torch.long, device=source.device)
    return torch.isin(source.long(), ids)


def lagging_rows(source: torch.Tensor, lag: torch.Tensor, other_model_ids: Sequence[int]) -> Optional[torch.Tensor]:
    """[B] bool: the policy's own rows sampled by weights the learner has moved from since (lag >= 1), and offline
    rows that are not another model's; None when there are none."""
    source = source.long()
    other = other_model_rows(source, other_model_ids)
    known = lag >= 0
    offline_own = ~known & ~other & (source != POLICY_SOURCE_ID)
    rows = (known & (lag >= 1)) | offline_own
    return rows if bool(rows.any()) else None


def ess_groups(
    scope: str, source: torch.Tensor, lag: Optional[torch.Tensor] = None
) -> Tuple[Optional[torch.Tensor], int]:
    """``(groups [B], number of groups)`` for ``ess_scope`` ``scope``: each row's source (``"source"``) or (source,
    lag) pair (``"version"``; rows of unknown lag form one group per source) as an index into the sorted union of the
    keys present on all learners; ``(None, 0)`` for ``"batch"``."""
    if scope == "batch":
        return None, 0
    source = source.long()
    key = source * _LAG_SLOTS + (lag.to(source.device).long() + 1) if scope == "version" and lag is not None else source
    local: List[int] = sorted(set(torch.unique(key).tolist()))
    if dist.is_available() and dist.is_initialized():
        gathered: List[List[int]] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(gathered, local)
        local = sorted(set().union(*gathered))
    ids = torch.tensor(local, dtype=torch.long, device=key.device)
    return torch.searchsorted(ids, key), len(local)
