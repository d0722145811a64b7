"""RLlib episodes that carry one completion each, and the completion records the learner batch is built from.

One `SingleAgentEpisode` per sampled completion, one env step long: observation = prompt token ids, action =
completion token ids, reward = the verifier's reward, ``extra_model_outputs`` = behavior log-probs of the sampled
tokens (one per completion token), the weights version (``weights_seq_no``) that produced them, the prompt group and
the data source. Texts and sampling parameters ride in the step's infos (`rllib_p3o.columns.Infos`), for recording
and debugging.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_p3o.columns import Record

# The record fields an episode keeps in its extra_model_outputs.
_EXTRA = (Record.BEHAVIOR_LOGPROBS, Record.WEIGHTS_SEQ_NO, Record.GROUP_ID, Record.SOURCE_ID)


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
    """A finished 1-step episode holding one completion of ``prompt_ids``."""
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
            Record.BEHAVIOR_LOGPROBS: np.asarray(behavior_logprobs, dtype=np.float32),
            Record.WEIGHTS_SEQ_NO: int(weights_seq_no),
            Record.GROUP_ID: int(group_id),
            Record.SOURCE_ID: int(source_id),
        },
    )
    return ep


def episodes_to_records(episodes: Sequence[SingleAgentEpisode]) -> List[Dict[str, Any]]:
    """Completion records (`rllib_p3o.columns.Record`) of completion episodes, without advantage and staleness."""
    records = []
    for ep in episodes:
        extra = {k: ep.get_extra_model_outputs(k, 0) for k in _EXTRA}
        records.append({
            Record.PROMPT_IDS: np.asarray(ep.get_observations(0), dtype=np.int64),
            Record.COMPLETION_IDS: np.asarray(ep.get_actions(0), dtype=np.int64),
            Record.BEHAVIOR_LOGPROBS: np.asarray(extra[Record.BEHAVIOR_LOGPROBS], dtype=np.float32),
            Record.REWARD: float(ep.get_rewards(0)),
            Record.WEIGHTS_SEQ_NO: int(extra[Record.WEIGHTS_SEQ_NO]),
            Record.GROUP_ID: int(extra[Record.GROUP_ID]),
            Record.SOURCE_ID: int(extra[Record.SOURCE_ID]),
            Record.INFOS: ep.get_infos(-1),
        })
    return records
