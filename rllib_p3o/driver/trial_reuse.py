"""Tune's actor reuse (`P3O.reset_config`): which settings may change between two trials sharing one actor.

The runners, their engines, tokenizer and data stay; so only settings that reach the driver and the learner alone
may differ (`RESETTABLE_KEYS`, `config_differences`); `reset_trial` starts the next trial in a running algorithm.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.utils.debug.deterministic import update_global_seed_if_necessary
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o.core.settings import SETTINGS
from rllib_p3o.reward_models.server import ACTORS_KEY as REWARD_MODEL_ACTORS

logger = logging.getLogger(__name__)

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


def reset_trial(algo: Any, new_config: Dict[str, Any]) -> bool:
    """`P3O.reset_config`'s work: start the next trial in ``algo`` (a running `P3O`), keeping its EnvRunners and their
    engines (the slow part of a start), with a new learner, offline inputs, data position and metrics.

    Only `RESETTABLE_KEYS` (and keys `P3OConfig` does not define, such as a sweep's own) may differ from the running
    config; anything else needs new runners, so this returns False and Tune fails the trial with the message logged
    here (run such trials in separate experiments, or without ``reuse_actors``)."""
    t0 = time.perf_counter()
    new = algo.get_default_config().update_from_dict(new_config)
    new.validate()  # (validation also fills in settings, which the comparison needs)
    different = config_differences(algo._config_in_use, new)
    if different:
        logger.error(
            "P3O.reset_config cannot reuse this actor: %s differ(s) from the running trial; only %s may change between "
            "reused trials.",
            ", ".join(different),
            ", ".join(RESETTABLE_KEYS),
        )
        return False
    if getattr(algo, "_reward_models", None) is not None:  # the same reward models (compared above): kept
        new.env_config = {**new.env_config, REWARD_MODEL_ACTORS: algo._reward_models.names}
    new.freeze()
    for source in algo._sources:
        source.close()
    algo._weight_sync.close()
    algo.learner_group.shutdown()
    algo.config = new
    update_global_seed_if_necessary(new.framework_str, new.seed)
    algo.metrics = MetricsLogger(root=True, stats_cls_lookup=new.stats_cls_lookup)
    algo._counters.clear()
    algo._timers.clear()
    spaces = {INPUT_ENV_SPACES: (new.observation_space, new.action_space), **(algo.spaces or {})}
    algo.learner_group = new.build_learner_group(
        rl_module_spec=new.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
    )
    if algo.offline_data is not None:  # the next trial's inputs, provenance and order, from their first row
        algo.offline_data = algo.offline_data.reopened(new)
    algo._setup_training_state(actor_reused=True, t0=t0)
    return True
