"""RLlib episodes that carry one completion each, and the completion records the learner batch is built from.

One `SingleAgentEpisode` per sampled completion. Single-turn, it is one env step long: observation = prompt token
ids, action = completion token ids, reward = the verifier's reward. Multi-turn (`rllib_p3o.runner.multiturn`), it has one
step per model turn: the reset observation is the prompt's ids, each action a model turn's engine ids, each later
observation the environment turn's ids that follow it (empty after the last turn), each reward that turn's reward.
Every step's ``extra_model_outputs`` hold the behavior log-probs of its action tokens (and under top-k/top-p sampling
each token's kept set, `rllib_p3o.core.columns.Record.KEPT_IDS`), the weights version
(``weights_seq_no``) that produced them, the prompt group and the data source. Texts and sampling parameters ride
in the last step's infos (`rllib_p3o.core.columns.Infos`), for recording and debugging.

As a record, an episode's completion is every token after the prompt, model and environment turns interleaved as
they were played; ``loss_mask`` is 1 on model tokens and 0 on environment tokens (whose behavior log-probs are 0
placeholders). Single-turn records carry no loss mask: all their completion tokens are the model's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_p3o.core import columns
from rllib_p3o.core.columns import ROW, TOKEN, Field, Record


def _row_extras(values: Mapping[str, Any]) -> Dict[str, Any]:
    """The per-row fields an episode carries (`rllib_p3o.core.columns.FIELDS` with ``episode=True``), from
    ``values``, each as its declared dtype (its default where ``values`` lacks it)."""
    out = {}
    for f in columns.FIELDS:
        if f.episode and f.per == ROW:
            value = values.get(f.key, f.default)
            if value is None:
                raise ValueError(f"a completion episode needs {f.what}")
            out[f.key] = f.dtype(value).item()
    return out


def _token_extras(values: Mapping[str, Any], tokens: int) -> Dict[str, np.ndarray]:
    """The per-token fields an episode step carries for its ``tokens`` action tokens (`rllib_p3o.core.columns.FIELDS`
    with ``episode=True``), from ``values``, each as its declared dtype: a ragged field as ``[tokens, W]`` (left
    out when ``values`` has none: an extra per-token buffer in every episode costs the runners measurable time),
    another field its values or, where ``values`` lacks them, its default at every token."""
    out = {}
    for f in columns.FIELDS:
        if f.episode and f.per == TOKEN:
            value = values.get(f.key)
            if f.ragged:
                if value is not None:  # untruncated sampling carries none: the decoders read it as absent
                    out[f.key] = columns.ragged_array(value, tokens, f.dtype)
                continue
            if value is None and f.fallback is not None:  # left out: its row field's value at every token
                continue
            if value is None and f.default is not None:
                value = np.full(tokens, f.default)
            if value is None:
                raise ValueError(f"a completion episode needs {f.what}")
            out[f.key] = np.asarray(value, dtype=f.dtype)
    return out


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
    extras: Mapping[str, Any] | None = None,
    kept_ids: Any = None,
) -> SingleAgentEpisode:
    """A finished 1-step episode holding one completion of ``prompt_ids``. ``extras``: values of further declared
    fields (`rllib_p3o.core.columns.FIELDS`), per row or per completion token. ``kept_ids``: each token's kept set
    under top-k/top-p sampling (``[tokens, W]``; None: untruncated)."""
    row = _row_extras(
        {
            **(extras or {}),
            Record.WEIGHTS_SEQ_NO: weights_seq_no,
            Record.GROUP_ID: group_id,
            Record.SOURCE_ID: source_id,
        }
    )
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
            **_token_extras(
                {**(extras or {}), Record.BEHAVIOR_LOGPROBS: behavior_logprobs, Record.KEPT_IDS: kept_ids},
                len(completion_ids),
            ),
            **row,
        },
    )
    return ep


class Turn(NamedTuple):
    """One model turn of a multi-turn episode and the environment turn after it."""

    action_ids: Sequence[int]  # the engine's token ids of the model turn
    behavior_logprobs: Sequence[float]  # one per action token
    reward: float
    env_ids: Sequence[int]  # token ids of the environment's turn that follows (empty after the last turn)
    kept_ids: Any = None  # top-k/top-p sampling: each action token's kept set, [tokens, W] (None: untruncated)
    # Values of further declared per-token fields (`rllib_p3o.core.columns.FIELDS`) for the action tokens.
    extras: Optional[Mapping[str, Any]] = None


def multi_turn_episode(
    *,
    prompt_ids: Sequence[int],
    turns: Sequence[Turn],
    terminated: bool,
    weights_seq_no: int,
    group_id: int,
    source_id: int = 0,
    infos: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
) -> SingleAgentEpisode:
    """A finished episode with one step per model turn (module docstring); ``infos`` go to the last step,
    ``extras`` (further declared per-row fields) to every step, each turn's per-token fields (`Turn`) to its step."""
    row = _row_extras(
        {
            **(extras or {}),
            Record.WEIGHTS_SEQ_NO: weights_seq_no,
            Record.GROUP_ID: group_id,
            Record.SOURCE_ID: source_id,
        }
    )
    if not turns:
        raise ValueError("a multi-turn episode needs at least one model turn")
    ep = SingleAgentEpisode()
    ep.add_env_reset(observation=np.asarray(prompt_ids, dtype=np.int64))
    for k, t in enumerate(turns):
        last = k == len(turns) - 1
        ep.add_env_step(
            observation=np.asarray(t.env_ids, dtype=np.int64),
            action=np.asarray(t.action_ids, dtype=np.int64),
            reward=float(t.reward),
            infos=dict(infos or {}) if last else {},
            terminated=terminated and last,
            truncated=(not terminated) and last,
            extra_model_outputs={
                **_token_extras(
                    {**(t.extras or {}), Record.BEHAVIOR_LOGPROBS: t.behavior_logprobs, Record.KEPT_IDS: t.kept_ids},
                    len(t.action_ids),
                ),
                **row,
            },
        )
    return ep


def episodes_to_records(episodes: Sequence[SingleAgentEpisode]) -> List[Dict[str, Any]]:
    """Completion records (`rllib_p3o.core.columns.Record`) of completion episodes, without advantage and staleness."""
    carried = [f for f in columns.FIELDS if f.episode]
    records = []
    for ep in episodes:
        record = {
            Record.PROMPT_IDS: np.asarray(ep.get_observations(0), dtype=np.int64),
            Record.COMPLETION_IDS: np.asarray(ep.get_actions(0), dtype=np.int64),
            Record.REWARD: float(ep.get_return()),
            Record.INFOS: ep.get_infos(-1),
        }
        for f in carried:  # per-token fields of a multi-turn episode: `_interleaved_turns` below
            if (f.ragged or f.fallback) and f.key not in ep.extra_model_outputs:  # an episode built without it
                continue
            value = ep.get_extra_model_outputs(f.key, 0)
            record[f.key] = np.asarray(value, dtype=f.dtype) if f.per != ROW else f.dtype(value).item()
        if len(ep) > 1:
            record.update(_interleaved_turns(ep))
        records.append(record)
    return records


def _interleaved_turns(ep: SingleAgentEpisode) -> Dict[str, np.ndarray]:
    """A multi-turn episode's completion ids, loss mask and every per-token field it carries
    (`rllib_p3o.core.columns.FIELDS`), over the model turns and the environment turns between them, in order."""
    observations, actions = ep.get_observations(), ep.get_actions()
    carried = [f for f in columns.FIELDS if f.episode and f.per == TOKEN and f.key in ep.extra_model_outputs]
    ids, mask = [], []
    values: Dict[str, List[Optional[np.ndarray]]] = {f.key: [] for f in carried}
    for k, action in enumerate(actions):
        ids.append(np.asarray(action, dtype=np.int64))
        mask.append(np.ones(len(action), dtype=np.int8))
        for f in carried:
            value = ep.get_extra_model_outputs(f.key, k)
            values[f.key].append(
                columns.ragged_array(value, len(action), f.dtype) if f.ragged else np.asarray(value, dtype=f.dtype)
            )
        if k < len(actions) - 1:  # the environment's turn before the next model turn
            env_ids = np.asarray(observations[k + 1], dtype=np.int64)
            ids.append(env_ids)
            mask.append(np.zeros(len(env_ids), dtype=np.int8))
            for f in carried:
                values[f.key].append(None)  # the environment's tokens: `_join_turns` pads them
    return {
        Record.COMPLETION_IDS: np.concatenate(ids),
        **{f.key: _join_turns(f, values[f.key], [len(i) for i in ids]) for f in carried},
        Record.LOSS_MASK: np.concatenate(mask),
    }


def _join_turns(field: Field, turns: List[Optional[np.ndarray]], lengths: List[int]) -> np.ndarray:
    """One per-token field over a whole multi-turn completion: each model turn's values, and on the environment's
    tokens (None in ``turns``) the field's padding, 0 (a ragged field: none at any of them, and every turn padded to
    the widest)."""
    if not field.ragged:
        return np.concatenate([np.zeros(n, dtype=field.dtype) if t is None else t for t, n in zip(turns, lengths)])
    width = max(t.shape[1] for t in turns if t is not None)
    parts = [np.full((n, width), columns.KEPT_PAD, dtype=field.dtype) for n in lengths]
    for part, t in zip(parts, turns):
        if t is not None:
            part[:, : t.shape[1]] = t
    return np.concatenate(parts)
