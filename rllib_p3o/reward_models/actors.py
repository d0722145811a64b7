"""The driver starts one actor per ``env_config["reward_models"]`` entry and stops them with the algorithm.

Each actor (`rllib_p3o.reward_models.server.RewardModelServer`) gets the entry's ``num_cpus`` and ``num_gpus`` and a
name unique to this algorithm, which the runners receive in their ``env_config`` and look up on their first call.
The actors are scheduled outside a Tune trial's placement group (the trial reserves its runners and learners, not
these), so the cluster must have their resources free: a start that takes longer than ``startup_timeout_s`` is an
error that names the model and its request.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, List, Mapping, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rllib_p3o.reward_models.server import ACTORS_KEY, RewardModelError, RewardModelServer, reward_model_specs

logger = logging.getLogger(__name__)


class RewardModelActors:
    """The reward-model actors of one algorithm: started (and waited for) in ``__init__``, killed by `stop`."""

    @classmethod
    def start_for(cls, config: Any) -> Optional["RewardModelActors"]:
        """The actors of an online config's ``env_config["reward_models"]``, started before its runners, whose names it
        then gives the runners in its ``env_config`` (the algorithm's own copy of the config); None without any."""
        if not (config.env_config or {}).get("reward_models") or not config.is_online:
            return None
        actors = cls(config.env_config)
        frozen, config._is_frozen = config._is_frozen, False
        config.env_config = {**config.env_config, ACTORS_KEY: actors.names}
        config._is_frozen = frozen
        return actors

    def __init__(self, env_config: Mapping[str, Any]):
        self.specs: List[Dict[str, Any]] = reward_model_specs(env_config)
        run = uuid.uuid4().hex[:12]
        self.names = [f"rllib_p3o_reward_model_{run}_{i}" for i in range(len(self.specs))]
        self.actors: List[Any] = []
        self.loaded: List[Dict[str, Any]] = []
        try:
            for spec, name in zip(self.specs, self.names):
                self.actors.append(
                    ray.remote(RewardModelServer)
                    .options(
                        name=name,
                        num_cpus=spec["num_cpus"],
                        num_gpus=spec["num_gpus"],
                        scheduling_strategy="DEFAULT",  # not in a Tune trial's placement group
                        max_restarts=0,
                    )
                    .remote(spec)
                )
            for spec, actor in zip(self.specs, self.actors):
                self.loaded.append(_wait_ready(spec, actor))
        except BaseException:
            self.stop()
            raise
        for spec, loaded in zip(self.specs, self.loaded):
            logger.info("reward model %r (%s) ready: %s", spec["name"], spec["model"], loaded)

    def stop(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001  (already gone)
                pass
        self.actors = []


def _wait_ready(spec: Mapping[str, Any], actor: Any) -> Dict[str, Any]:
    timeout = float(spec["startup_timeout_s"])
    what = f"reward model {spec['name']!r} ({spec['model']})"
    try:
        return ray.get(actor.ready.remote(), timeout=timeout)
    except GetTimeoutError as e:
        raise RewardModelError(
            f"{what} did not start within startup_timeout_s={timeout:g}: its actor asks for "
            f"num_cpus={spec['num_cpus']:g}, num_gpus={spec['num_gpus']:g}, outside the runners' and learners' "
            "resources; free them in the cluster, lower the request, or raise 'startup_timeout_s' for a large model."
        ) from e
    except (RayActorError, RayTaskError) as e:
        cause = getattr(e, "cause", None) or e
        raise RewardModelError(f"{what} failed to load: {type(cause).__name__}: {cause}") from e
