"""Tune's actor reuse (`P3O.reset_config`): which settings may change between two trials sharing one actor.

The runners, their engines, tokenizer and data stay; so only settings that reach the driver and the learner alone
may differ. Pure configuration: no Ray actors, no Tune.
"""

from __future__ import annotations

from typing import Any, List

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from rllib_p3o.core.settings import SETTINGS
from rllib_p3o.reward_models.server import ACTORS_KEY as REWARD_MODEL_ACTORS

# RLlib's settings that reach only the driver and the learner (``input_``: P3O reads offline data on the driver, and
# `P3O.reset_config` opens the next trial's inputs anew).
RLLIB_RESETTABLE_KEYS = (
    "seed",
    "input_",
    "lr",
    "grad_clip",
    "grad_clip_by",
    "num_epochs",
    "minibatch_size",
    "shuffle_batch_per_epoch",
)
# Settings that may change between two trials sharing one Tune actor (`P3O.reset_config`): they reach only the
# driver and the learner, never the EnvRunners' engines, tokenizer or data. P3O's own are those declared
# ``resettable`` (`rllib_p3o.core.settings`).
RESETTABLE_KEYS = RLLIB_RESETTABLE_KEYS + tuple(s.name for s in SETTINGS if s.resettable)


def config_differences(old: AlgorithmConfig, new: AlgorithmConfig) -> List[str]:
    """Names of the settings ``old`` and ``new`` do not share, leaving out `RESETTABLE_KEYS`, private attributes and
    keys the config class does not define (a Tune search's own keys). Both go through a dict round trip first, as
    Tune's trial configs do (RLlib rewrites some settings, e.g. its old-stack ``policies``, on the way)."""
    old, new = (type(old)().update_from_dict(c.to_dict()) for c in (old, new))
    for c in (old, new):  # the names of a run's reward-model actors, which the driver adds (they are kept)
        c.env_config = {k: v for k, v in (c.env_config or {}).items() if k != REWARD_MODEL_ACTORS}
    defined = [k for k in type(old)().__dict__ if not k.startswith("_") and k not in RESETTABLE_KEYS]
    return [k for k in defined if not _same(getattr(old, k, None), getattr(new, k, None))]


def _same(a: Any, b: Any) -> bool:
    """Equal settings, a list and a tuple of the same items alike (a restored Tune experiment's trial configs hold
    lists where the fresh ones hold tuples, e.g. RLlib's ``policies``)."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (e.g. arrays: ambiguous truth value)
        return False
