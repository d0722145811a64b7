"""What P3O reports: the metric keys of its results, and how the driver's per-iteration figures are computed.

Where the keys live in ``algo.train()``'s result (Tune flattens them with "/", see `column`):
    reward, heldout_reward, ess, tokens_per_s
                                            the run at a glance (`SUMMARY`): copies of four figures below, first
                                            in every result, so that Tune's status table shows them
    p3o/<key>                               the driver's figures of the iteration (this module)
    p3o/rewards/<function name>             each reward function's mean over the iteration's completions it scored
                                            (TRL's rewards/<name>/mean)
    p3o/by_source/<source name>/<key>       per data source (`rllib_p3o.core.sources`): reward and length of the
                                            sampled completions, and the learners' ESS, cap fraction, KL...
    learners/default_policy/<key>           the objective's figures (keys of the registered losses, `rllib_p3o.core.losses`),
                                            per staleness under by_staleness/<versions behind>/
    env_runners/<key>                       the runners' generate_time_s, generated_tokens_per_s, idle_time_s
    env_runners/multi_turn/<key>            multi-turn episodes, per episode: turns, truncated (fraction), and
                                            the environment's counters (ToolEnv: tool_calls, tool_errors)
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Any, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import LEARNER_RESULTS

from rllib_p3o.core.batch_stats import groups_without_signal
from rllib_p3o.core.columns import Columns, Infos, Record
from rllib_p3o.core.sources import SourceNames

# Top-level key of the driver's figures.
P3O = "p3o"

# -- p3o/<key>: one training iteration ---------------------------------------------------------------------------
REWARD_MEAN = "reward_mean"
# Completions that no reward function scored (each returned None): reward NaN, advantage 0 (TRL's rule).
UNSCORABLE_COMPLETIONS = "unscorable_completions"
COMPLETION_LEN_MEAN = "completion_len_mean"
NUM_COMPLETIONS = "num_completions"
NUM_OFFLINE_ROWS = "num_offline_rows"
GENERATED_TOKENS = "generated_tokens"
TRAINED_TOKENS = "trained_tokens"
GENERATED_TOKENS_PER_S = "generated_tokens_per_s"
# Generated tokens per second over the last `TOKEN_RATE_WINDOW` iterations (`TokenRate`): the screen's tokens/s. The
# per-iteration rate divides by the time the driver waited for the samples, which in async mode is near 0 when the
# runners generated them ahead (rows of 13,622 and 107,282 tokens/s on a machine that generates about 1,000).
RECENT_TOKENS_PER_S = "recent_tokens_per_s"
TOKEN_RATE_WINDOW = 5
TRAINED_TOKENS_PER_S = "trained_tokens_per_s"
# Share of prompt groups whose rewards are all equal: their advantages are 0, they teach nothing.
GROUPS_WITHOUT_SIGNAL = "groups_without_signal"
WEIGHTS_SEQ_NO = Columns.WEIGHTS_SEQ_NO
# The loss all-reduces its statistics, so every learner must have used the same ESS: this must be 0.
ESS_SPREAD_ACROSS_LEARNERS = "ess_spread_across_learners"
OFFLINE_ROWS_SKIPPED = "offline_rows_skipped"
# Offline files read as the policy's own data and as another model's (`rllib_p3o.data.provenance`); a file with rows
# of both counts in both.
OFFLINE_FILES_POLICY = "offline_files_policy"
OFFLINE_FILES_OTHER_MODEL = "offline_files_other_model"
# Held-out evaluation (greedy), as "heldout_" + the runner's keys (reward_mean, num_prompts).
HELDOUT_PREFIX = "heldout_"
HELDOUT_REWARD_MEAN = HELDOUT_PREFIX + REWARD_MEAN
NUM_PROMPTS = "num_prompts"
# Async sampling and staleness (policy samples only).
STALENESS_MEAN = "staleness_mean"
STALENESS_MAX = "staleness_max"
DROPPED_STALE_SAMPLES = "dropped_stale_samples"
# In-flight weight updates: the share of the step's policy completions whose tokens span weight versions.
SPANNING_VERSIONS_SHARE = "spanning_versions_share"
DROPPED_STALE_SAMPLES_LIFETIME = "dropped_stale_samples_lifetime"
LEARNER_WAIT_FOR_DATA_S = "learner_wait_for_data_s"
# Sampling recipes (`rllib_p3o.data.sampling_recipes`): groups left out by dynamic sampling and the extra rounds it
# took; the share of completions whose longest model turn reached max_tokens, and the mean overlong penalty added.
GROUPS_FILTERED = "groups_filtered"
GROUPS_FILTERED_LIFETIME = "groups_filtered_lifetime"
EXTRA_SAMPLING_ROUNDS = "extra_sampling_rounds"
TRUNCATED_SHARE = "truncated_share"
OVERLONG_PENALTY_MEAN = "overlong_penalty_mean"
# Faults and resume (`rllib_p3o.driver.sampler`, `P3O.restore_env_runners`, the learner's non-finite guard).
HEALTHY_ENV_RUNNERS = "healthy_env_runners"
ENV_RUNNER_RESTARTS_LIFETIME = "env_runner_restarts_lifetime"
# Completions a dead runner took with it (its prompt groups were sampled again by the others, or will be).
SAMPLES_LOST = "samples_lost"
SAMPLES_LOST_LIFETIME = "samples_lost_lifetime"
# Async mode: prompt groups in flight or queued when the checkpoint being restored was written. They are not in
# the checkpoint; their prompts are sampled again first, with the restored weights.
GROUPS_RESAMPLED_AFTER_RESTORE = "groups_resampled_after_restore"
# Optimizer steps whose loss or gradient was not finite: not applied (see `P3OTorchLearner`). Under p3o/ the
# run's total; under learners/default_policy/ the iteration's.
SKIPPED_NONFINITE_STEPS = "skipped_nonfinite_steps"
# A trial's start (with its first result): seconds from the actor's setup (or Tune's reset of a reused actor) to
# the first sync of the initial weights, and whether Tune reused the previous trial's actor (`P3O.reset_config`).
SETUP_S = "setup_s"
# 1.0 when the rollouts' FP8 is simulated (weights rounded through float8_e4m3fn; `rollout_quantization`).
ROLLOUT_FP8_SIMULATED = "rollout_fp8_simulated"
ACTOR_REUSED = "actor_reused"
# Where the iteration's time went.
TIME_GENERATE_S = "time_generate_s"
TIME_BATCHING_S = "time_batching_s"
TIME_OFFLINE_READ_S = "time_offline_read_s"
TIME_TRAIN_S = "time_train_s"
TIME_SYNC_S = "time_sync_s"
TIME_OTHER_S = "time_other_s"
TIME_EVAL_S = "time_eval_s"  # the held-out evaluation at the start of an iteration (when there is one)
# Weight sync: "sync_" + the runners' load statistics (max over runners).
SYNC_PREFIX = "sync_"
# The split of one sync: the driver gathers the learner's weights; each runner fetches them from the object store
# (transfer) and reloads its engine. The probe check (`rllib_p3o.sync.probe`): the learner's side, in the background
# (PROBE_LEARNER_S), and, for checks at load, the engine's (VERIFY_S; riding along, it is part of generation).
GATHER_S = "gather_s"
PROBE_LEARNER_S = "probe_learner_s"
TRANSFER_S = "transfer_s"
ENGINE_RELOAD_S = "engine_reload_s"
VERIFY_S = "verify_s"
LOAD_S = "load_s"  # the runner's whole part: transfer + reload + verify
SYNC_BYTES = "bytes"
PROBE_MAX_ABS_DIFF = "probe_max_abs_diff"
SYNC_PROBE_MAX_ABS_DIFF = SYNC_PREFIX + PROBE_MAX_ABS_DIFF

# Group of the runners' multi-turn figures (keys: `rllib_p3o.core.columns.Infos.TURNS`, `.TRUNCATED`, env counters).
MULTI_TURN = "multi_turn"

# -- groups: p3o/rewards/<function name> (each reward function's mean), p3o/by_source/<name>/<key>, learners/default_policy/by_staleness/<k>/<key> -----------------------------
REWARDS = "rewards"
BY_SOURCE = "by_source"
BY_STALENESS = "by_staleness"
NUM_TOKENS = "num_tokens"

# -- learners/default_policy/<key>: the objective's own keys (`rllib_p3o.core.losses`) -------------------------------
ESS = "ess"
CAP_FRACTION = "cap_fraction"
KL_BEHAVIOR = "kl_behavior"
KL_WEIGHT = "kl_weight"
RATIO_MEAN = "ratio_mean"
RATIO_MAX = "ratio_max"
PG_LOSS = "pg_loss"
LOSS = "loss"
CLIP_FRACTION = "clip_fraction"  # GRPO only
# P3O's losses: the KL term's share of the gradient w.r.t. the token log-probs, and the share of tokens with
# log(πθ/π_b) < -10 (`rllib_p3o.core.losses.parts.gradient_shares`).
KL_GRAD_SHARE = "kl_grad_share"
REJECTED_FRACTION = "rejected_fraction"
KL_REF = "kl_ref"  # with kl_ref_coeff > 0
# Trust regions on stale data: P3O's `trust_region` (tokens whose policy gradient it removed, the share of lagging
# tokens it acts on, the widest band's ε), M2PO's second-moment mask (mean (log r)² before it, tokens it left out)
# and decoupled PPO's behavior-weight mask; `grpo_seq_mask`'s dropped sequences (their valid tokens).
TRUST_MASKED_FRACTION = "trust_masked_fraction"
LAGGING_FRACTION = "lagging_fraction"
TRUST_EPS_MAX = "trust_eps_max"
M2 = "m2"
M2_MASKED_FRACTION = "m2_masked_fraction"
BEHAVIOR_MASKED_FRACTION = "behavior_masked_fraction"
SEQ_MASKED_FRACTION = "seq_masked_fraction"

# -- learners/default_policy/<key>: the training-inference mismatch, on fresh samples -------------------------------
# Measured on the policy's own tokens of staleness 0 in the first minibatch of each update (the learner's weights are
# then the ones that sampled them), so what they show is engine vs learner numerics and rollout precision alone:
# ~0 with float32 on both sides. Names after peers' (prime-rl's mismatch_kl, verl's rollout-IS ESS).
MISMATCH_KL = "mismatch_kl"  # token-mean k3 estimate of KL(π_engine || π_learner), samples from the engine
MISMATCH_PROB_ABS_DIFF = "mismatch_prob_abs_diff"  # token-mean |π_learner(y_t) - π_engine(y_t)|
MISMATCH_ESS = "mismatch_ess"  # ESS of the ratios π_learner / π_engine of those tokens
MISMATCH_NUM_TOKENS = "mismatch_num_tokens"
# Share of the token positions the learner's forward passes computed that were padding (rows run in buckets of
# similar length, `rllib_p3o.learner.length_buckets`), over an update's minibatches.
PADDING_SHARE = "padding_share"
# The same share had every row been padded to the longest row of its minibatch (as without length buckets).
PADDING_SHARE_UNBUCKETED = "padding_share_unbucketed"
# Top-k/top-p sampling: share of the minibatch's completion tokens whose kept set was larger than the runners recorded
# (`kept_set_cap`), left out of the loss; logged only for batches with kept sets.
KEPT_SET_OVERFLOW_SHARE = "kept_set_overflow_share"
# Seconds the learner spent recomputing π_old before an update (losses that need it: grpo_tis, grpo_seq_mask, ...).
OLD_LOGPROBS_S = "old_logprobs_s"

# Prompts of the datasets left out or cut from the left to fit the context (`overlong_prompts`), under p3o/.
PROMPTS_DROPPED = "prompts_dropped"
PROMPTS_TRUNCATED = "prompts_truncated"

# -- env_runners/<key> ---------------------------------------------------------------------------------------------
GENERATE_TIME_S = "generate_time_s"
# Time a runner sat without a sample() request (async mode keeps it near 0).
IDLE_TIME_S = "idle_time_s"


def column(*keys: str) -> str:
    """A result key as Tune's flattened column name: ``column(P3O, REWARD_MEAN) == "p3o/reward_mean"``."""
    return "/".join(keys)


def lookup(result: Mapping[str, Any], *keys: str) -> Any:
    """``result[k1][k2]...``, or None where a key is missing: ``lookup(result, *LEARNER, ESS)``."""
    node: Any = result
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# The learners' figures of the default module, as a path prefix: column(*LEARNER, ESS) == "learners/default_policy/ess".
LEARNER = (LEARNER_RESULTS, DEFAULT_MODULE_ID)

# -- top level: the run at a glance --------------------------------------------------------------------------------
# Tune's status table shows the first few top-level numbers of a result (beside the iteration and the time), and
# `tune.TuneConfig(metric=...)` can name them: copies of the figures a person watches, first in every result.
REWARD = "reward"  # p3o/reward_mean: mean reward of the iteration's sampled completions
HELDOUT_REWARD = "heldout_reward"  # p3o/heldout_reward_mean of the latest held-out evaluation (kept in between)
SUMMARY_ESS = "ess"  # learners/default_policy/ess
TOKENS_PER_S = "tokens_per_s"  # p3o/recent_tokens_per_s: generated tokens per second of the last iterations
# (top-level key, where its value is in the result)
SUMMARY = (
    (REWARD, (P3O, REWARD_MEAN)),
    (HELDOUT_REWARD, (P3O, HELDOUT_REWARD_MEAN)),
    (SUMMARY_ESS, (*LEARNER, ESS)),
    (TOKENS_PER_S, (P3O, RECENT_TOKENS_PER_S)),
)


class ResultColumns:
    """Keeps every result's keys those of the run's first result, in the same order: a key missing from a result is
    reported as NaN.

    Why: Tune's ``progress.csv`` takes its columns from the first result a process writes, and a restored run appends
    to the same file. Had the first result after a restore one key more or less than the file's header (a figure
    that first appeared mid-run, or only after the restore), the rows would no longer line up with the header.
    So the columns (saved with the checkpoint) are fixed by the first result; keys that appear later are still
    reported (they reach result.json and TensorBoard), except in the first result after a restore, whose keys must
    be exactly the file's. Paths are tuples of keys (a source name may hold a "/"); ``config`` is left alone.
    """

    def __init__(self, columns: Optional[Sequence[Sequence[str]]] = None):
        self.columns: Optional[List[Tuple[str, ...]]] = [tuple(c) for c in columns] if columns is not None else None

    def apply(self, result: Dict[str, Any], only_known: bool = False) -> Dict[str, Any]:
        """``result`` with the known columns first, in their order (NaN where missing), then any new keys (left out
        with ``only_known``). The first call fixes the columns."""
        flat = dict(_flatten(result))
        if self.columns is None:
            self.columns = list(flat)
            return result
        known = set(self.columns)
        out: Dict[str, Any] = {}
        for path in self.columns:
            _set_path(out, path, flat.get(path, float("nan")))
        if not only_known:
            for path, value in flat.items():
                if path not in known:
                    _set_path(out, path, value)
        if "config" in result:
            out["config"] = result["config"]
        return out


def _flatten(node: Mapping[str, Any], prefix: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], Any]]:
    for key, value in node.items():
        if not prefix and key == "config":
            continue
        if isinstance(value, Mapping):  # an empty one has no column (nor in Tune's flattening)
            yield from _flatten(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _set_path(node: Dict[str, Any], path: Tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


@contextlib.contextmanager
def timed(timings: Dict[str, float], key: str) -> Iterator[None]:
    """Sets ``timings[key]`` to the wall time of the ``with`` block (seconds)."""
    t0 = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - t0


def step_metrics(
    records: Sequence[Mapping[str, Any]],
    batch: Mapping[str, np.ndarray],
    timings: Mapping[str, float],
    sync_stats: Mapping[str, float],
    per_learner_ess: Sequence[float],
    *,
    num_offline_rows: int,
    weights_seq_no: int,
    offline_rows_skipped: Optional[int] = None,
    offline_files: Optional[Mapping[str, int]] = None,
) -> Dict[str, float]:
    """The ``p3o/<key>`` figures of one iteration from its online ``records`` and the trained ``batch``
    (``offline_files``: `OFFLINE_FILES_POLICY` and `OFFLINE_FILES_OTHER_MODEL`, of an offline run).

    Rates divide by the time of their phase (floored at 1 ns). Staleness covers the policy's records only.
    """
    n_gen = int(sum(generated_tokens(r) for r in records))
    n_trained = int(batch[Columns.COMPLETION_MASK].sum())
    step: Dict[str, float] = {
        NUM_COMPLETIONS: len(records),
        NUM_OFFLINE_ROWS: num_offline_rows,
        GENERATED_TOKENS: n_gen,
        TRAINED_TOKENS: n_trained,
        TRAINED_TOKENS_PER_S: n_trained / max(timings[TIME_TRAIN_S], 1e-9),
        WEIGHTS_SEQ_NO: weights_seq_no,
        ESS_SPREAD_ACROSS_LEARNERS: (max(per_learner_ess) - min(per_learner_ess)) if per_learner_ess else 0.0,
        **timings,
        **{SYNC_PREFIX + k: v for k, v in sync_stats.items()},
    }
    if records:
        rewards = np.asarray([r[Record.REWARD] for r in records], dtype=np.float64)
        groups = np.asarray([r[Record.GROUP_ID] for r in records], dtype=np.int64)
        step.update(
            {
                REWARD_MEAN: nan_mean(rewards),
                UNSCORABLE_COMPLETIONS: int(np.isnan(rewards).sum()),
                COMPLETION_LEN_MEAN: n_gen / len(records),
                GROUPS_WITHOUT_SIGNAL: groups_without_signal(torch.from_numpy(rewards), torch.from_numpy(groups)),
                GENERATED_TOKENS_PER_S: n_gen / max(timings[TIME_GENERATE_S], 1e-9),
            }
        )
        stale = [r[Record.STALENESS] for r in records if r.get(Record.STALENESS, -1) >= 0]
        if stale:
            step.update({STALENESS_MEAN: float(np.mean(stale)), STALENESS_MAX: int(np.max(stale))})
            # A per-token version is carried only by completions that span versions (`Record.POLICY_VERSION`).
            spanning = sum(
                r.get(Record.POLICY_VERSION) is not None for r in records if r.get(Record.STALENESS, -1) >= 0
            )
            step[SPANNING_VERSIONS_SHARE] = spanning / len(stale)
    if offline_rows_skipped is not None:
        step[OFFLINE_ROWS_SKIPPED] = offline_rows_skipped
    step.update(offline_files or {})
    return step


class TokenRate:
    """Generated tokens per second over the last ``window`` iterations: their tokens over their time (evaluations
    left out). An iteration's own time can be far shorter than the generation of its samples (async mode: the runners
    generated them during the iterations before), so one iteration alone can spike; over a window its tokens are
    weighed against the time of the iterations whose samples were generated meanwhile."""

    def __init__(self, window: int = TOKEN_RATE_WINDOW):
        self._iterations: Deque[Tuple[float, float]] = collections.deque(maxlen=window)

    def add(self, tokens: float, seconds: float) -> float:
        """Count one iteration's generated tokens and time; returns the rate over the window."""
        self._iterations.append((float(tokens), float(seconds)))
        return sum(t for t, _ in self._iterations) / max(sum(s for _, s in self._iterations), 1e-9)


def nan_mean(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (NaN when there are none), without numpy's warning."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else float("nan")


def rewards_by_function(records: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """``{function name: mean}``: each reward function's mean over the completions it scored (None, read as NaN,
    left out: TRL's ``nanmean``), from the records' `Infos.REWARDS`."""
    values: Dict[str, List[float]] = {}
    for r in records:
        for name, v in ((r.get(Record.INFOS) or {}).get(Infos.REWARDS) or {}).items():
            values.setdefault(name, []).append(v)
    return {name: nan_mean(v) for name, v in values.items()}


def generated_tokens(record: Mapping[str, Any]) -> int:
    """Model-generated tokens of a completion record (a multi-turn record's environment tokens are not)."""
    mask = record.get(Record.LOSS_MASK)
    return int(np.sum(mask)) if mask is not None else len(record[Record.COMPLETION_IDS])


def records_by_source(records: Sequence[Mapping[str, Any]], names: SourceNames) -> Dict[Tuple[str, str], float]:
    """``{(source name, key): value}``: reward, completion length and count of the sampled records per source."""
    by: Dict[int, List[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(r[Record.SOURCE_ID], []).append(r)
    out: Dict[Tuple[str, str], float] = {}
    for sid, rs in by.items():
        name = names.name(sid)
        out[(name, REWARD_MEAN)] = nan_mean([r[Record.REWARD] for r in rs])
        out[(name, COMPLETION_LEN_MEAN)] = float(np.mean([generated_tokens(r) for r in rs]))
        out[(name, NUM_COMPLETIONS)] = len(rs)
    return out


def learner_values(learner_results: Sequence[Dict[str, Any]], key: str) -> List[float]:
    """Each learner's ``key`` figure of the policy module (learners that did not report it are left out)."""
    return [
        float(r[DEFAULT_MODULE_ID][key].peek())
        for r in learner_results
        if DEFAULT_MODULE_ID in r and key in r[DEFAULT_MODULE_ID]
    ]


def learners_by_source(learner_results: Sequence[Dict[str, Any]], names: SourceNames) -> Dict[Tuple[str, str], float]:
    """``{(source name, key): value}`` from the learners' ``by_source/<id>/...`` figures, averaged over learners.

    Removes them from ``learner_results``: the learners know ids only, the result shows them under names.
    """
    collected: Dict[Tuple[str, str], List[float]] = {}
    for r in learner_results:
        for sid, stats in r.get(DEFAULT_MODULE_ID, {}).pop(BY_SOURCE, {}).items():
            for key, stat in stats.items():
                collected.setdefault((names.name(int(sid)), key), []).append(float(stat.peek()))
    return {k: float(np.mean(v)) for k, v in collected.items()}
