"""Which rows of a minibatch a loss treats alike: their lag behind the current weights, whether a trust region acts
on them, and their ESS group. Pure torch (the learner calls these on every minibatch; tests call them without Ray).

- **lag**: optimizer steps between the weights that sampled a row (or, where in-flight weight updates reached a
  completion, each of its tokens) and the current weights: the row's staleness when the update began (async: policy
  versions behind its oldest token; a newer token is that many versions fresher) plus the optimizer steps this update
  has applied since (a batch's second minibatch, or second epoch, is one step behind). -1 where it is not known:
  offline rows and another model's rows carry no version of this policy.
- **lagging**: the policy's own rows with lag ≥ 1, and offline rows of the policy's own lineage (their lag is
  unknown, but not 0). Never another model's rows (live or recorded: `rllib_p3o.core.sources.is_other_model_id`). Trust regions (`rllib_p3o.core.losses.trust_region`) act on these.
- **ESS groups** (``ess_scope``): "batch": none (one ESS); "source": one group per source; "version": one per
  (source, lag) pair. Numbered over the union of the groups on all learners, so every learner runs the same
  collectives.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from rllib_p3o.core.sources import OTHER_MODEL_ID_BASE, POLICY_SOURCE_ID

# A (source, lag) pair as one integer: source ids are < 2^31 and lags small, so the pair packs into an int64.
_LAG_SLOTS = 1 << 20


def row_lag(
    staleness: torch.Tensor,
    steps_in_update: int,
    row_version: Optional[torch.Tensor] = None,
    token_versions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``staleness + steps_in_update`` where the staleness is known (>= 0), -1 elsewhere: [B] per row, or with
    ``token_versions`` [B, T] (and the rows' own, oldest, ``row_version`` [B]) [B, T] per token, each token that many
    versions fresher than its row's oldest."""
    staleness = staleness.long()
    lag = torch.where(staleness >= 0, staleness + int(steps_in_update), staleness)
    if token_versions is None or row_version is None:
        return lag
    newer = (token_versions.long() - row_version.long().unsqueeze(-1)).clamp(min=0)
    return torch.where(
        lag.unsqueeze(-1) >= 0, (lag.unsqueeze(-1) - newer).clamp(min=0), lag.unsqueeze(-1).expand_as(newer)
    )


def other_model_rows(source: torch.Tensor) -> torch.Tensor:
    """[B] bool: rows whose source is another model's (`rllib_p3o.core.sources.is_other_model_id`: a behavior model's
    live rows, or offline rows another model recorded)."""
    return source.long() > OTHER_MODEL_ID_BASE


def lagging_rows(source: torch.Tensor, lag: torch.Tensor) -> Optional[torch.Tensor]:
    """[B] (or, for a per-token ``lag``, [B, T]) bool: the policy's own rows (tokens) sampled by weights the learner
    has moved from since (lag >= 1), and offline rows of the policy's own lineage; None when there are none."""
    source = source.long()
    other = other_model_rows(source)
    if lag.dim() == 2:
        source, other = source.unsqueeze(-1).expand_as(lag), other.unsqueeze(-1).expand_as(lag)
    known = lag >= 0
    offline_own = ~known & ~other & (source != POLICY_SOURCE_ID)
    rows = (known & (lag >= 1)) | offline_own
    return rows if bool(rows.any()) else None


def ess_groups(
    scope: str, source: torch.Tensor, lag: Optional[torch.Tensor] = None
) -> Tuple[Optional[torch.Tensor], int]:
    """``(groups, number of groups)`` for ``ess_scope`` ``scope``: each row's source (``"source"``, [B]) or (source,
    lag) pair (``"version"``, [B] or, for a per-token ``lag``, [B, T]; rows of unknown lag form one group per source)
    as an index into the sorted union of the keys present on all learners; ``(None, 0)`` for ``"batch"``."""
    if scope == "batch":
        return None, 0
    source = source.long()
    if scope == "version" and lag is not None:
        lag = lag.to(source.device).long()
        key = (source.unsqueeze(-1) if lag.dim() == 2 else source) * _LAG_SLOTS + (lag + 1)
    else:
        key = source
    local: List[int] = sorted(set(torch.unique(key).tolist()))
    if dist.is_available() and dist.is_initialized():
        gathered: List[List[int]] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(gathered, local)
        local = sorted(set().union(*gathered))
    ids = torch.tensor(local, dtype=torch.long, device=key.device)
    return torch.searchsorted(ids, key), len(local)
