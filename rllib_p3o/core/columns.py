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
                    [B, T-1, W] kept_ids: the sampler's kept set of each target under top-k/top-p sampling
                               (`KEPT_PAD` after it; W = 0 when nothing in the batch was truncated)
                    [B, T-1]   policy_version: the weights version that sampled each target (a completion that
                               in-flight weight updates reached spans several; else the row's weights_seq_no)
    row columns     [B]        advantages, weights_seq_no, source_id, staleness
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np

try:  # RLlib's name for the weights version a sample was taken with; the learner's compute core imports this
    # module without Ray (`rllib_p3o.learner.compute`), where the name is RLlib's own string.
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO as _RLLIB_WEIGHTS_SEQ_NO
except ImportError:
    _RLLIB_WEIGHTS_SEQ_NO = "weights_seq_no"


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
    # Top-k/top-p sampling: the token ids the sampler kept at each target [B, T-1, W] (`KEPT_PAD` after them; a row
    # of `KEPT_PAD` only: sampled untruncated; `KEPT_OVERFLOW` first: the kept set was larger than recorded).
    KEPT_IDS = "kept_ids"
    # The weights version that sampled each target [B, T-1]: with in-flight weight updates a completion's tokens may
    # come from several versions (`rllib_p3o.runner.inflight`); otherwise the row's weights_seq_no at every token.
    POLICY_VERSION = "policy_version"


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
    # Top-k/top-p sampling: [completion tokens, W] int32, each token's kept set (absent: sampled untruncated).
    KEPT_IDS = Columns.KEPT_IDS
    # One weights version per completion token (absent: every token of the row's WEIGHTS_SEQ_NO, which is then the
    # completion's oldest version).
    POLICY_VERSION = Columns.POLICY_VERSION


# Kept sets (`Columns.KEPT_IDS`): the padding after a token's kept set, and the mark of a token whose kept set was
# larger than the runner recorded (`kept_set_cap`): the learner leaves that token out of the loss.
KEPT_PAD = -1
KEPT_OVERFLOW = -2


def kept_set_candidates(top_k: Optional[int], top_p: Optional[float], cap: int) -> int:
    """How many candidates of the processed distribution a runner asks vLLM for (``SamplingParams.logprobs``) to
    record each token's kept set under ``top_k``/``top_p`` sampling: one more than the largest kept set it records
    (``top_k``, else ``cap``; at most ``cap``), so that a larger set shows; 0 when sampling is untruncated or
    ``cap`` is 0 (nothing recorded)."""
    truncated = (top_k is not None and top_k > 0) or (top_p is not None and top_p < 1.0)
    if not truncated or cap <= 0:
        return 0
    return (min(int(top_k), cap) if top_k is not None and top_k > 0 else cap) + 1


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


# -- the column spec ---------------------------------------------------------------------------------------------------

ROW = "row"  # one value per completion
TOKEN = "token"  # one value per completion token (a target column of the batch)


@dataclasses.dataclass(frozen=True)
class Field:
    """One thing a completion carries from where it is produced to the learner, declared once.

    ``key``: its record key. ``per``: `ROW` or `TOKEN` (one value per completion token: placed at the completion's
    target positions, 0 elsewhere). ``dtype``: numpy dtype in the episode and the batch. ``batch``: its learner batch
    column (None: not in the batch). ``default``: its value when a record lacks it (None: required).
    ``episode``: carried in the runner's episodes (``extra_model_outputs``) to the driver. ``file``: its trajectory
    Parquet column (None: not recorded), of pyarrow type ``arrow`` (``"int64"``, ``"float32"``, ``"string"``,
    ``"list<float32>"``, ...); ``nullable``: a missing value is written as null and read back as ``default``.
    ``label``: its name in error messages (default: ``key``). ``ragged``: a per-token field whose value at each
    token is a list of ids (a ``[tokens, W]`` array padded with `KEPT_PAD`; its batch column is ``[B, T-1, W]``,
    W the widest of the batch, padded with `KEPT_PAD`; a record without it: none at any token). ``fallback``: a
    per-token field that episodes and records may leave out (as a ragged one may): its value at every token is then
    the record's row field ``fallback`` (an extra per-token buffer in every episode costs the runners time; only
    the completions that need it carry it).

    `pad_records` (batching), the episode builders and `episodes_to_records`, the recorder and the trajectory
    reader all loop over `FIELDS`: a new column is one `Field` here plus the code that produces its value (the
    runner's rollouts, passing it in ``extras``, or the trajectory files).
    """

    key: str
    per: str
    dtype: type
    batch: Optional[str] = None
    default: Any = None
    episode: bool = False
    file: Optional[str] = None
    arrow: Optional[str] = None
    nullable: bool = False
    label: str = ""
    ragged: bool = False
    fallback: Optional[str] = None

    @property
    def what(self) -> str:
        return self.label or self.key


# The completion's tokens (prompt_ids, completion_ids, loss_mask) make the token columns and the completion mask;
# everything else a completion carries is declared here.
FIELDS: Tuple[Field, ...] = (
    Field(
        Record.BEHAVIOR_LOGPROBS, TOKEN, np.float32, batch=Columns.BEHAVIOR_LOGPROBS, episode=True,
        file="behavior_logprobs", arrow="list<float32>", label="behavior log-probs",
    ),
    # The prompt group (advantages are normalized within it); offline rows may name groups by any string.
    Field(Record.GROUP_ID, ROW, np.int64, episode=True, file="group_id", arrow="string", nullable=True),
    Field(Record.ADVANTAGE, ROW, np.float32, batch=Columns.ADVANTAGES, file="advantage", arrow="float32", nullable=True),
    # The policy weights version: RLlib's name in the batch, "policy_version" in the trajectory files.
    Field(
        Record.WEIGHTS_SEQ_NO, ROW, np.int64, batch=Columns.WEIGHTS_SEQ_NO, default=0, episode=True,
        file="policy_version", arrow="int64",
    ),
    Field(Record.SOURCE_ID, ROW, np.int64, batch=Columns.SOURCE_ID, default=0, episode=True),
    # The sampler's kept set of each token under top-k/top-p (`rllib_p3o.runner.rollouts.kept_sets`); not recorded in
    # trajectory files (offline rows: none).
    Field(
        Record.KEPT_IDS, TOKEN, np.int32, batch=Columns.KEPT_IDS, episode=True, label="kept sets", ragged=True,
    ),
    Field(Record.STALENESS, ROW, np.int64, batch=Columns.STALENESS, default=-1),
    # The weights version of each token, where a completion spans several (in-flight weight updates): the row's
    # weights_seq_no (its oldest) at every token otherwise. "policy_versions" in the trajectory files, beside the
    # row's policy_version.
    Field(
        Record.POLICY_VERSION, TOKEN, np.int64, batch=Columns.POLICY_VERSION, episode=True, file="policy_versions",
        arrow="list<int64>", nullable=True, label="policy versions", fallback=Record.WEIGHTS_SEQ_NO,
    ),
)  # fmt: skip

TOKEN_COLUMNS: Tuple[str, ...] = (Columns.INPUT_IDS, Columns.ATTENTION_MASK)
TARGET_COLUMNS: Tuple[str, ...] = (Columns.COMPLETION_MASK,) + tuple(
    f.batch for f in FIELDS if f.batch and f.per == TOKEN
)
ROW_COLUMNS: Tuple[str, ...] = tuple(f.batch for f in FIELDS if f.batch and f.per == ROW)
BATCH_COLUMNS: Tuple[str, ...] = TOKEN_COLUMNS + TARGET_COLUMNS + ROW_COLUMNS

DTYPES: Dict[str, type] = {
    Columns.INPUT_IDS: np.int64,
    Columns.ATTENTION_MASK: np.int64,
    Columns.COMPLETION_MASK: np.float32,
    **{f.batch: f.dtype for f in FIELDS if f.batch},
}


def batch_layout(
    fields: Tuple[Field, ...],
) -> Tuple[Tuple[str, ...], Tuple[str, ...], Tuple[str, ...], Dict[str, type]]:
    """``(token, target, row columns, dtypes)`` of the learner batch that ``fields`` make (`FIELDS` by default;
    the batching functions read the module's `FIELDS` when they run, so a test may declare a column)."""
    target = (Columns.COMPLETION_MASK,) + tuple(f.batch for f in fields if f.batch and f.per == TOKEN)
    row = tuple(f.batch for f in fields if f.batch and f.per == ROW)
    dtypes = {
        **{k: DTYPES[k] for k in (*TOKEN_COLUMNS, Columns.COMPLETION_MASK)},
        **{f.batch: f.dtype for f in fields if f.batch},
    }
    return TOKEN_COLUMNS, target, row, dtypes


def ragged_array(values: Any, tokens: int, dtype: type = np.int32) -> np.ndarray:
    """A ragged field's value (`Field.ragged`) as a ``[tokens, W]`` array (None or empty: ``[tokens, 0]``)."""
    if values is None or np.size(values) == 0:
        return np.zeros((tokens, 0), dtype=dtype)
    out = np.asarray(values, dtype=dtype)
    if out.ndim != 2 or len(out) != tokens:
        raise ValueError(f"kept sets of shape {out.shape} for {tokens} tokens")
    return out


def to_file(field: Field, value: Any) -> Any:
    """A record's value of ``field`` as its trajectory column holds it (None where it is missing and nullable)."""
    if value is None:
        if field.nullable:
            return None
        value = field.default
    if field.arrow.startswith("list<"):
        return np.asarray(value, dtype=field.dtype).tolist()
    if field.arrow == "string":
        return str(value)
    return field.dtype(value).item()


def from_file(field: Field, value: Any) -> Any:
    """A trajectory column's value of ``field`` as a record holds it: its default where it is null (None when the
    field is nullable and has none), a list as a numpy array of its dtype, a string as it is. A null may reach here
    as None or, through a pandas/numpy batch of Ray Data, as a float NaN."""
    if value is None or (isinstance(value, (float, np.floating)) and value != value):
        return field.default
    if field.arrow.startswith("list<"):
        return np.asarray(value, dtype=field.dtype)
    if field.arrow == "string":
        return value
    return field.dtype(value).item()
