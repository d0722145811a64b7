"""Names of the data one completion carries on its way to the learner, in one place (like RLlib's `Columns`).

A completion travels in three shapes, each with its own names here:
- a completion *episode* (`rllib_p3o.data.episodes`): one RLlib env step whose ``extra_model_outputs`` use `Record`'s
  names and whose infos use `Infos`' names (texts, sampling parameters);
- a completion *record*, a dict with `Record`'s keys, built from an episode or from a trajectory row; the driver
  adds the advantage and the staleness;
- a padded *learner batch*, a dict of numpy arrays with `Columns`' names, built by `rllib_p3o.data.batching`.

Layout of a learner batch of B rows right-padded to T tokens (targets are ``input_ids[:, 1:]``, so completion token
``j`` of a row with a prompt of ``P`` tokens sits at target position ``P - 1 + j``):

    token columns   [B, T]     input_ids (padding: the tokenizer's pad id), attention_mask (0)
    target columns  [B, T-1]   completion_mask (1 on model-generated completion targets: a multi-turn record's
                               environment tokens are 0), behavior_logprobs (log π_b of that target)
    row columns     [B]        advantages, weights_seq_no, source_id, staleness
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO as _RLLIB_WEIGHTS_SEQ_NO


class Columns:
    """Columns of the learner batch."""

    INPUT_IDS = "input_ids"
    ATTENTION_MASK = "attention_mask"
    COMPLETION_MASK = "completion_mask"
    BEHAVIOR_LOGPROBS = "behavior_logprobs"
    ADVANTAGES = "advantages"
    # The policy weights version that sampled the row. RLlib's own name: its TorchLearner reads this column to log
    # how many updates behind the learner each batch was (diff_num_grad_updates_vs_sampler_policy).
    WEIGHTS_SEQ_NO = _RLLIB_WEIGHTS_SEQ_NO
    # Which data source produced the row (`rllib_p3o.core.sources.source_id`).
    SOURCE_ID = "source_id"
    # Weights versions between sampler and learner; -1 where it does not apply (offline and behavior-model rows).
    STALENESS = "staleness"
    # Optional and never built by this package: reference-model log-probs [B, T-1] (else the learner computes them).
    REF_LOGPROBS = "ref_logprobs"
    # Log-probs of the learner's policy before the update [B, T-1], for losses that need π_old; added by the learner.
    OLD_LOGPROBS = "old_logprobs"


TOKEN_COLUMNS: Tuple[str, ...] = (Columns.INPUT_IDS, Columns.ATTENTION_MASK)
TARGET_COLUMNS: Tuple[str, ...] = (Columns.COMPLETION_MASK, Columns.BEHAVIOR_LOGPROBS)
ROW_COLUMNS: Tuple[str, ...] = (Columns.ADVANTAGES, Columns.WEIGHTS_SEQ_NO, Columns.SOURCE_ID, Columns.STALENESS)
BATCH_COLUMNS: Tuple[str, ...] = TOKEN_COLUMNS + TARGET_COLUMNS + ROW_COLUMNS

DTYPES: Dict[str, type] = {
    Columns.INPUT_IDS: np.int64,
    Columns.ATTENTION_MASK: np.int64,
    Columns.COMPLETION_MASK: np.float32,
    Columns.BEHAVIOR_LOGPROBS: np.float32,
    Columns.ADVANTAGES: np.float32,
    Columns.WEIGHTS_SEQ_NO: np.int64,
    Columns.SOURCE_ID: np.int64,
    Columns.STALENESS: np.int64,
}


class Record:
    """Keys of a completion record (a dict; see the module docstring)."""

    PROMPT_IDS = "prompt_ids"
    COMPLETION_IDS = "completion_ids"
    BEHAVIOR_LOGPROBS = Columns.BEHAVIOR_LOGPROBS  # one float per completion token
    REWARD = "reward"
    ADVANTAGE = "advantage"  # set by the driver (group z-score) or read from a trajectory row
    GROUP_ID = "group_id"  # the prompt group: advantages are normalized within it
    WEIGHTS_SEQ_NO = Columns.WEIGHTS_SEQ_NO
    SOURCE_ID = Columns.SOURCE_ID
    STALENESS = Columns.STALENESS  # set by the sampler
    INFOS = "infos"  # the episode's infos (`Infos`); online records only
    # Multi-turn only: 1 on model tokens, 0 on environment tokens of the completion (absent: all model tokens).
    LOSS_MASK = "loss_mask"


class Infos:
    """Keys of a completion episode's infos; the recorder writes them as the trajectory columns of the same name."""

    PROMPT = "prompt"
    COMPLETION = "completion"
    FINISH_REASON = "finish_reason"
    SOURCE = "source"  # the source's name (`rllib_p3o.core.sources`)
    TEMPERATURE = "temperature"
    TOP_P = "top_p"
    LOGPROBS_MODE = "logprobs_mode"
    # Multi-turn episodes (`rllib_p3o.runner.multiturn`): model turns played, whether the episode was cut by a limit, and
    # the environment's own counters (e.g. ToolEnv's tool_calls, tool_errors).
    TURNS = "turns"
    TRUNCATED = "truncated"
    # Each reward function's value for the completion, ``{name: value}`` (NaN where it returned None); the
    # completion's reward is their weighted sum (`rllib_p3o.data.rewards.RewardFunction`).
    REWARDS = "rewards"
