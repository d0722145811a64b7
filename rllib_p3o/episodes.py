"""RLlib episodes that carry one completion each, and the completion records the learner batch is built from.

One `SingleAgentEpisode` per sampled completion, one env step long: observation = prompt token ids, action =
completion token ids, reward = the verifier's reward, ``extra_model_outputs`` = behavior log-probs of the sampled
tokens (one per completion token), the policy version (``weights_seq_no``) that produced them, the prompt group,
the data source and the sampling parameters. Texts ride in the step's infos (for recording and debugging).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from ray.rllib.env.single_agent_episode import SingleAgentEpisode

BEHAVIOR_LOGPROBS = "behavior_logprobs"
WEIGHTS_SEQ_NO = "weights_seq_no"
GROUP_ID = "group_id"
SOURCE_ID = "source_id"


def completion_episode(
    *,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    behavior_logprobs: Sequence[float],
    reward: float,
    weights_seq_no: int,
    group_id: int,
    source_id: int = 0,
    infos: Mapping[str, Any] | None = None,
) -> SingleAgentEpisode:
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    ep = SingleAgentEpisode()
    ep.add_env_reset(observation=prompt)
    ep.add_env_step(
        observation=prompt,
        action=np.asarray(completion_ids, dtype=np.int64),
        reward=float(reward),
        infos=dict(infos or {}),
        terminated=True,
        extra_model_outputs={
            BEHAVIOR_LOGPROBS: np.asarray(behavior_logprobs, dtype=np.float32),
            WEIGHTS_SEQ_NO: int(weights_seq_no),
            GROUP_ID: int(group_id),
            SOURCE_ID: int(source_id),
        },
    )
    return ep


def episodes_to_records(episodes: Sequence[SingleAgentEpisode]) -> List[Dict[str, Any]]:
    """Completion records (see `rllib_p3o.batching`) from completion episodes, plus ``reward`` and ``group_id``."""
    records = []
    for ep in episodes:
        extra = {k: ep.get_extra_model_outputs(k, 0) for k in (BEHAVIOR_LOGPROBS, WEIGHTS_SEQ_NO, GROUP_ID, SOURCE_ID)}
        records.append({
            "prompt_ids": np.asarray(ep.get_observations(0), dtype=np.int64),
            "completion_ids": np.asarray(ep.get_actions(0), dtype=np.int64),
            "behavior_logprobs": np.asarray(extra[BEHAVIOR_LOGPROBS], dtype=np.float32),
            "reward": float(ep.get_rewards(0)),
            "weights_seq_no": int(extra[WEIGHTS_SEQ_NO]),
            "group_id": int(extra[GROUP_ID]),
            "source_id": int(extra[SOURCE_ID]),
            "infos": ep.get_infos(-1),
        })
    return records
