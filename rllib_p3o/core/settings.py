"""P3O's own settings, each declared once: type, default, help text, group, and whether Tune may change it between
trials that share an actor.

`P3OSettings` is the one list. `rllib_p3o.p3o.P3OConfig` takes its defaults from it, ``.training()`` accepts its
keys, validation runs its groups in order (`GROUPS`), `rllib_p3o.driver.trial_reuse.RESETTABLE_KEYS` is derived
from it, and the configuration reference (docs/reference/configuration.md) and the signature of
``P3OConfig.training`` are generated from it (``make reference``, `devtools.reference`; ``tests/test_settings.py``
fails when either is stale).

It lives in ``core/`` because every process holds the config (the EnvRunners and the learners get a copy); it is
pure declarations, no Ray.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rllib_p3o.core.precision import DTYPES, PRECISIONS, ROLLOUT_QUANTIZATIONS

# Groups in the order validation runs them and the reference lists them.
MODEL = "model"
LOSSES_GROUP = "losses"
SAMPLING = "sampling"
SYNC = "sync"
EVALUATION = "evaluation"
OFFLINE = "offline"
PRECISION = "precision"
RESOURCES = "resources"
GROUPS: Tuple[str, ...] = (MODEL, LOSSES_GROUP, SAMPLING, SYNC, EVALUATION, OFFLINE, PRECISION, RESOURCES)

# With in-flight weight updates, a running sequence's prefix KV after a load (`rllib_p3o.runner.inflight`).
INFLIGHT_KV_CACHE = ("recompute", "keep")
# How a setting that names files is resolved (`setting(path=...)`).
MODEL_PATH, MODEL_PATHS, OUTPUT_PATH, INPUT_PATH_KEYS = "model", "models", "output", "input_keys"
LOGPROBS_MODES = ("processed", "raw")
# How the learner computes token log-probs from the last hidden states (`rllib_p3o.learner.compute.TokenLogprobs`).
FUSED_HEAD_MODES = ("auto", "on", "off")
DEFAULT_FUSED_HEAD = "auto"


def setting(
    default: Any = None,
    *,
    group: str,
    help: str,
    factory: Any = None,
    resettable: bool = False,
    choices: Optional[Sequence[Any]] = None,
    minimum: Optional[float] = None,
    keyword: Optional[str] = None,
    path: Optional[str] = None,
) -> Any:
    """One declared setting (a dataclass field whose metadata carries the rest).

    ``resettable``: it reaches only the driver and the learner, so Tune may change it in a reused actor.
    ``choices``/``minimum``: checked by validation with a message naming the setting (None always passes).
    ``keyword``: the ``.training()`` keyword when it differs from the attribute (``model`` sets ``policy_model``:
    ``model`` is RLlib's legacy model dict). ``path``: the value names files, and how ``.training()`` resolves a
    relative one where the script runs (Tune runs each trial in a directory of its own): `MODEL_PATH` (a model
    directory or a hub id: made absolute when it exists here), `MODEL_PATHS` (a list of dicts whose ``"model"`` is
    one), `OUTPUT_PATH` (a directory to write: made absolute unless it is a URI), `INPUT_PATH_KEYS` (a dict keyed by
    offline input paths: its keys resolved as ``offline_data(input_=...)``'s are).
    """
    meta = dict(
        group=group,
        help=help,
        resettable=resettable,
        choices=tuple(choices) if choices is not None else None,
        minimum=minimum,
        keyword=keyword,
        path=path,
    )
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class P3OSettings:
    """Every P3O setting (RLlib's own, such as ``lr`` or ``num_epochs``, are RLlib's)."""

    # -- model -------------------------------------------------------------------------------------------------------
    policy_model: Optional[str] = setting(
        group=MODEL,
        keyword="model",
        path=MODEL_PATH,
        help="Hugging Face causal-LM directory (or hub id) of the policy; the tokenizer is loaded from it. A relative "
        "directory is made absolute by `.training()` (Tune runs each trial in a directory of its own); a path that "
        "is neither a directory nor a hub id fails validation, naming it.",
    )
    trust_remote_code: bool = setting(False, group=MODEL, help="Passed to transformers and vLLM; off unless asked.")
    lora: Optional[Dict[str, Any]] = setting(
        group=MODEL,
        help='Train a LoRA adapter instead of all weights: `{"r": 16, "alpha": 32, "target_modules": [...], '
        '"dropout": 0.0}` (defaults as shown; target_modules: every linear layer vLLM serves adapters on). Runners '
        "serve the frozen base with vLLM's LoRA support and swap in each synced adapter (verified by the probe); "
        "syncs and checkpoints carry the adapter only; the reference KL uses the base.",
    )
    logprob_chunk_size: int = setting(
        8,
        group=MODEL,
        minimum=1,
        help="Sequences per LM-head chunk in the learner once a batch's logits pass 64 MiB (the chunked head: "
        "`fused_head`).",
    )
    fused_head: str = setting(
        DEFAULT_FUSED_HEAD,
        group=MODEL,
        choices=FUSED_HEAD_MODES,
        help='How the learner turns the last hidden states into token log-probs. "on": the fused head '
        "(`rllib_p3o.learner.fused_head`): log π(y) = z_y − logsumexp(z), z = h·Wᵀ + b, 1024 tokens at a time from "
        "the hidden states and the head's weight, so the logits of a whole batch (and their gradient) never exist; "
        "equal to the full-logits head within 1e-5 in float32, and on a CPU at Qwen's vocabulary (151,936) its peak "
        "memory was 0.30-0.43x the chunked head's and its time 0.24-0.46x. Refused, with the reason, where it cannot "
        "serve: an LM head that is not a plain `torch.nn.Linear` (an adapter, a quantized or hooked head: its weight "
        "alone is not the head); a model whose logits are not `lm_head(h)`, or `cap·tanh(lm_head(h)/cap)` with `cap` "
        "its `final_logit_softcapping` (another scale or soft-cap, seen when the learner checks the model at start); "
        '`entropy_coeff` > 0 (it computes no entropy). "auto" (the default): off CUDA, the fused head where "on" '
        "would serve and the batch's float32 logits pass 64 MiB (where the chunked head would run them in chunks); "
        "on CUDA the chunked head, faster there (on an H200 the fused head's learner step took 1.05-1.19x the time "
        'and 0.58-0.83x the peak memory: use "on" where memory binds); everywhere else exactly "off", '
        'so smaller batches (all of the tiny models\' runs) compute as before. "off": '
        "the chunked head: the head's logits, log-softmax and gather per `logprob_chunk_size` sequences under "
        "activation checkpointing once the logits pass 64 MiB, in one piece below (and the model's whole forward "
        "where `lm_head(h)` is not its logits).",
    )

    # -- losses ------------------------------------------------------------------------------------------------------
    loss: str = setting(
        "p3o",
        group=LOSSES_GROUP,
        resettable=True,
        help="A registered loss (`rllib_p3o.core.losses`); the losses and their settings are listed below.",
    )
    loss_config: Dict[str, Any] = setting(
        group=LOSSES_GROUP,
        factory=dict,
        resettable=True,
        help='The loss\'s own settings, e.g. `{"clip_low": 0.2, "clip_high": 0.28}` for `grpo` or '
        '`{"kl_estimator": "k3_is"}` for `p3o`; validation builds the loss\'s settings dataclass from it, so an '
        "unknown key or a value the loss refuses fails before anything starts.",
    )
    kl_ref_coeff: float = setting(
        0.0,
        group=LOSSES_GROUP,
        resettable=True,
        minimum=0.0,
        help="Weight of a k3 KL to the frozen initial model (0 = off; the learner then loads it).",
    )
    entropy_coeff: float = setting(
        0.0,
        group=LOSSES_GROUP,
        resettable=True,
        help="Entropy bonus weight (0 = off; computing entropy needs the full vocabulary per token).",
    )
    max_consecutive_nonfinite_steps: int = setting(
        3,
        group=LOSSES_GROUP,
        resettable=True,
        minimum=1,
        help="An optimizer step whose loss or gradient is not finite is skipped (nothing reaches the weights) and "
        "counted in `p3o/skipped_nonfinite_steps`; after this many in a row the run stops with an error naming what "
        "was not finite.",
    )

    # -- sampling ----------------------------------------------------------------------------------------------------
    group_size: int = setting(
        8,
        group=SAMPLING,
        minimum=2,
        help="Completions sampled per prompt; advantages are normalized within each group (so at least 2).",
    )
    prompts_per_step: int = setting(
        16, group=SAMPLING, minimum=1, help="Prompts per training step (train batch = prompts_per_step * group_size)."
    )
    max_tokens: int = setting(
        64,
        group=SAMPLING,
        minimum=1,
        help="Most tokens per completion (per model turn in multi-turn episodes); vLLM's `max_tokens`.",
    )
    temperature: float = setting(1.0, group=SAMPLING, help="Sampling temperature of the rollouts.")
    top_p: float = setting(1.0, group=SAMPLING, help="Nucleus-sampling threshold of the rollouts (1.0: off).")
    top_k: int = setting(-1, group=SAMPLING, help="Top-k sampling of the rollouts (-1: off).")
    kept_set_cap: int = setting(
        64,
        group=SAMPLING,
        minimum=0,
        help="Top-k/top-p sampling with processed log-probs: each generated token records its kept set (the tokens "
        "the sampler kept, up to this many; vLLM returns them as the top candidates of the processed distribution) "
        "and the learner renormalizes its log-prob over that set, so the ratio compares the same truncated "
        "distribution. A token whose kept set is larger (top-p only) is left out of the loss "
        "(`kept_set_overflow_share`). With top-k alone it must be at least `top_k`. 0: record nothing (P3O's losses "
        "then refuse truncated sampling).",
    )
    logprobs_mode: str = setting(
        "processed",
        group=SAMPLING,
        choices=LOGPROBS_MODES,
        help='"processed": log-probs of the sampling distribution, after temperature and top-p/top-k, i.e. the true '
        'behavior policy, which the importance ratio needs when sampling at T != 1; "raw": the model\'s own.',
    )
    vllm_kwargs: Dict[str, Any] = setting(
        group=SAMPLING,
        factory=dict,
        help="Extra `vllm.LLM` arguments (e.g. `kv_cache_memory_bytes`, `max_model_len`).",
    )
    async_sampling: bool = setting(
        False,
        group=SAMPLING,
        help="Runners keep generating while the learners update; weights reach them without a pause (each runner "
        "loads them after its current sample). Needs remote EnvRunners. The data are up to as many versions old as "
        "sample() calls each runner has in flight: RLlib's env_runners(max_requests_in_flight_per_env_runner=k), 1 "
        "by default (one version old); more keeps the engines busier at the price of staler data.",
    )
    max_staleness: int = setting(
        2,
        group=SAMPLING,
        minimum=0,
        help="In async mode, policy samples more than this many weight versions behind the learner are dropped "
        "(and counted); a completion's staleness is its oldest token's.",
    )
    inflight_weight_updates: bool = setting(
        False,
        group=SAMPLING,
        help="Async mode only: new weights reach the sequences a runner is generating. Each runner keeps more prompt "
        "groups in its engine than one sample returns, returns the first to finish and continues the others after "
        "the next weight load, between two engine steps, so a completion may span weight versions (each token's "
        "version is recorded as `policy_version` and its behavior log-prob is that version's). Single-turn policy "
        "rollouts with the in-process vLLM engine; not with multi-turn environments, behavior models or LoRA.",
    )
    inflight_kv_cache: str = setting(
        "recompute",
        group=SAMPLING,
        choices=INFLIGHT_KV_CACHE,
        help="With `inflight_weight_updates`: what new weights do to the KV cache of a running sequence's prefix. "
        '"recompute": the sequence is prefilled again with the new weights, so each later token is sampled exactly '
        'from its version given its prefix; "keep" (PipelineRL\'s): the old-weight KV stays, which saves the prefill '
        "but samples later tokens from the new weights attending to old-weight keys and values (the engine then runs "
        "without a prefix cache).",
    )
    behavior_models: List[Dict[str, Any]] = setting(
        group=SAMPLING,
        path=MODEL_PATHS,
        factory=list,
        help="Frozen models whose engines generate a share of every prompt group, each a dict with `model` (HF path), "
        "`samples` (completions per group) or `share` (of `group_size`), and optionally `name` and its own "
        "`temperature`/`top_p`/`top_k`/`max_tokens`. Their sampled-token log-probs are the behavior log-probs; "
        "their weights are never synced. They must use the policy's tokenizer.",
    )
    dynamic_sampling: bool = setting(
        False,
        group=SAMPLING,
        help="DAPO's dynamic sampling (verl's `filter_groups`): prompt groups whose rewards are all equal (no "
        "signal) are left out and more groups are sampled until the step has `prompts_per_step` groups with signal, "
        "for at most `dynamic_sampling_max_rounds` extra rounds (then groups without signal fill the step). The "
        "left-out groups' prompts count as drawn (resume continues after them). In async mode they are left out of "
        "the chunks and more chunks are taken.",
    )
    dynamic_sampling_max_rounds: int = setting(
        8,
        group=SAMPLING,
        minimum=0,
        help="With `dynamic_sampling`, extra sampling rounds per step at most (sync mode).",
    )
    overlong_buffer: int = setting(
        0,
        group=SAMPLING,
        minimum=0,
        help="DAPO's overlong shaping (verl's `overlong_buffer.len`): a model turn longer than `max_tokens` minus "
        "this many tokens gets a penalty growing linearly to `overlong_penalty` at `max_tokens` (a multi-turn "
        "episode: its longest turn); added to the reward before advantages. 0: off.",
    )
    overlong_penalty: float = setting(
        1.0,
        group=SAMPLING,
        minimum=0,
        help="With `overlong_buffer`, the penalty at `max_tokens` (verl's `overlong_buffer.penalty_factor`).",
    )
    overlong_prompts: str = setting(
        "error",
        group=SAMPLING,
        choices=("error", "drop", "truncate_left"),
        help='A prompt longer than the model\'s context minus `max_tokens` (chat template applied): `"error"` names '
        'its dataset, row and length when the config is validated, before any engine starts; `"drop"` leaves such '
        "rows out (verl's `filter_overlong_prompts`); `\"truncate_left\"` keeps their last tokens (TRL's "
        "`max_prompt_length`, left). Metrics `prompts_dropped` and `prompts_truncated` count them.",
    )
    log_completions: int = setting(
        0,
        group=SAMPLING,
        minimum=0,
        help="Rows of sample completions written after each iteration to "
        "`<trial dir>/completions/iter_<iteration>.parquet`: prompt, completion, reward, each reward function's "
        "value, advantage and source, whole prompt groups (TRL's `log_completions`); 0 writes none.",
    )

    # -- sync --------------------------------------------------------------------------------------------------------
    verify_weight_sync: bool = setting(
        True,
        group=SYNC,
        help="After each sync, check that the engine's log-probs on a probe sequence match the learner's (raises on "
        "a silent sync failure).",
    )
    weight_sync_tolerance: Optional[float] = setting(
        group=SYNC,
        help="Largest allowed |learner - engine| log-prob on that probe. The learner scores the probe with the "
        "weights exactly as sent (cast to `rollout_dtype`, FP8-rounded if simulated), so what is left is the "
        "engine's kernel numerics. It bounds the mean difference over the probe's tokens, and each token's together "
        "with `weight_sync_rtol`. None: by the engine's precision, 1e-3 for float32 and 0.08 for bfloat16 "
        "(`rllib_p3o.sync.payload.DEFAULT_TOLERANCES`).",
    )
    weight_sync_rtol: Optional[float] = setting(
        group=SYNC,
        help="A probe token may differ by `weight_sync_tolerance` plus this times its |log-prob|: a low-precision "
        "engine's rounding error grows with the magnitude (with rtol > 0, up to 10% of the tokens may exceed that "
        "by up to twice it: `rllib_p3o.sync.probe.check_probe`). None: 0 for float32 engines, 0.1 for bfloat16.",
    )
    weight_sync_timeout_s: float = setting(
        300.0,
        group=SYNC,
        help="A runner that has not loaded new weights within this many seconds raises `WeightSyncError` naming it, "
        "instead of a silent hang.",
    )

    # -- evaluation --------------------------------------------------------------------------------------------------
    eval_interval: int = setting(
        1,
        group=EVALUATION,
        resettable=True,
        minimum=0,
        help="Held-out evaluation every this many iterations (needs `eval_dataset` in env_config); 0 disables.",
    )
    eval_max_prompts: int = setting(
        200, group=EVALUATION, resettable=True, help="At most this many held-out prompts per evaluation."
    )
    eval_temperature: float = setting(
        0.0,
        group=EVALUATION,
        resettable=True,
        minimum=0.0,
        help="Sampling temperature of the held-out evaluation; 0 answers greedily. Above 0, the reported held-out "
        "reward is the mean over `eval_samples_per_prompt` samples per prompt (the avg@k of LLM-RL papers).",
    )
    eval_samples_per_prompt: int = setting(
        1,
        group=EVALUATION,
        resettable=True,
        minimum=1,
        help="Completions per held-out prompt when `eval_temperature` > 0.",
    )

    # -- offline -----------------------------------------------------------------------------------------------------
    offline_fraction: Optional[float] = setting(
        group=OFFLINE,
        help="Share of each training batch's rows taken from the offline dataset (`config.offline_data(input_=PATH)`"
        "); the rest are online rollouts. None: 1.0 when an offline dataset is configured (offline-only), else 0.0.",
    )
    offline_skip_bad_rows: bool = setting(
        False, group=OFFLINE, help="Drop (and count) invalid offline rows instead of refusing to start."
    )
    offline_rescore_model: Optional[str] = setting(
        group=OFFLINE, path=MODEL_PATH, help="HF model that scores, once, offline rows without `behavior_logprobs`."
    )
    offline_max_seq_len: int = setting(
        512, group=OFFLINE, minimum=1, help="Longest prompt + completion of an offline row, in tokens."
    )
    offline_reader: str = setting(
        "auto",
        group=OFFLINE,
        choices=("auto", "ray_data", "in_process"),
        help='Who reads the offline data. `"ray_data"`: Ray Data tasks and prelearner actors beside the trial, which '
        "need CPUs the trial does not hold (the prelearner actors' `map_batches_kwargs` CPUs + 1; 3 by default); a "
        'cluster without them is refused before the trial starts. `"in_process"`: the trial\'s own process, all rows '
        'in memory (the same batches; for a laptop). `"auto"`: Ray Data when the cluster has those CPUs, else in '
        "process.",
    )
    offline_provenance: Any = setting(
        "auto",
        group=OFFLINE,
        resettable=True,
        path=INPUT_PATH_KEYS,
        help='Whose data each offline input is (`rllib_p3o.data.provenance`). `"auto"`: a row whose recorded '
        "`model_fingerprint` is the policy's lineage (the weights the run starts from, or a model it was exported "
        "from) is the policy's own, gets the trust region and a KL pull toward its sampler; every other row, and every "
        "row of a file that records no model (third-party data), is another model's and gets what a behavior model's "
        'live rows get (no trust region; the weight `other_model_weight` names; under `kl_anchor="auto"` the KL toward π_old, never toward the recorder). '
        '`"policy"` or `"other"`: that answer for every input; or a dict `{input path: "policy" | "other"}` for some '
        'inputs (a file or a directory of them; the others `"auto"`). `rllib-p3o validate --model MODEL` and the '
        "run's first lines say how each file is read.",
    )
    offline_shuffle: bool = setting(
        True,
        group=OFFLINE,
        resettable=True,
        help="Read the offline rows in an order drawn from the run's `seed` (a new order each pass over the data; a "
        "restored run draws the same), so that two seeds train on different batches. False: in file order, every "
        'seed alike. With `offline_reader="ray_data"` the order is Ray Data\'s `random_shuffle` with the seed, the '
        "same on every pass.",
    )
    record_rollouts: Optional[str] = setting(
        group=OFFLINE,
        path=OUTPUT_PATH,
        resettable=True,
        help="Directory to which every sampled batch is written as trajectory Parquet: a local path (a relative one "
        "is made absolute by `.training()`, not inside a Tune trial's directory) or a URI pyarrow's filesystems "
        "open (`s3://bucket/traj`, `gs://...`, `hdfs://...`); a scheme pyarrow has no filesystem for is refused.",
    )

    # -- precision ---------------------------------------------------------------------------------------------------
    precision: Optional[str] = setting(
        group=PRECISION,
        choices=PRECISIONS,
        help='The learner\'s precision: "fp32" (also when None), "bf16-mixed" (float32 '
        "master weights and optimizer state, forward and backward under bfloat16 autocast; checkpoints hold the "
        'float32 weights), "bf16" (pure bfloat16: weights and Adam\'s state in bfloat16) or "fp16" (pure float16).',
    )
    rollout_dtype: Optional[str] = setting(
        group=PRECISION,
        choices=sorted(DTYPES),
        help='The dtype the vLLM engines run in: "float32", "bfloat16" or "float16". None: the learner\'s compute '
        'dtype (bfloat16 under "bf16-mixed"). Weights are cast to it before each sync; the behavior log-probs are '
        "the engine's, so the ratio carries the precision gap.",
    )
    rollout_quantization: Optional[str] = setting(
        group=PRECISION,
        choices=ROLLOUT_QUANTIZATIONS,
        help="FP8 rollouts. \"fp8\": vLLM's FP8 quantization of the engine's linear layers, re-quantized from every "
        'sync (GPU only). "fp8_simulated": every linear weight is rounded through float8_e4m3fn with one scale per '
        "output channel before it is loaded, and the engine computes in `rollout_dtype` (works on CPU). Not with "
        "LoRA.",
    )

    # -- resources ---------------------------------------------------------------------------------------------------
    num_threads_per_learner: Optional[int] = setting(
        group=RESOURCES,
        minimum=1,
        help="Torch/OpenMP threads of each learner; None: its Ray CPUs (`P3OConfig.learner_threads`). Async mode only "
        "overlaps generation and training when the thread budgets fit the cores (OpenMP threads spin-wait).",
    )
    num_threads_per_env_runner: Optional[int] = setting(
        group=RESOURCES,
        minimum=1,
        help="Torch/OpenMP threads of each runner's engine; None: its Ray CPUs (`P3OConfig.env_runner_threads`).",
    )


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared setting, read from `P3OSettings`'s field."""

    name: str
    type: str
    group: str
    help: str
    resettable: bool
    choices: Optional[Tuple[Any, ...]]
    minimum: Optional[float]
    keyword: str
    path: Optional[str]
    _field: dataclasses.Field = dataclasses.field(repr=False, compare=False)

    def default(self) -> Any:
        """A fresh default (a new dict or list for those that are)."""
        if self._field.default_factory is not dataclasses.MISSING:
            return self._field.default_factory()
        return copy.copy(self._field.default)

    def problem(self, value: Any) -> Optional[str]:
        """Why ``value`` is refused by the declaration (choices, minimum), or None. None always passes: it means
        "the default" for every setting that has choices or a minimum."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"{self.name} must be one of {', '.join(map(str, self.choices))}, got {value!r}."
        if self.minimum is not None:
            try:
                ok = float(value) >= self.minimum
            except (TypeError, ValueError):
                ok = False
            if not ok:
                return f"{self.name} must be >= {self.minimum:g}, got {value!r}."
        return None


def _settings() -> Tuple[Setting, ...]:
    out = []
    for f in dataclasses.fields(P3OSettings):
        meta = f.metadata
        out.append(
            Setting(
                name=f.name,
                type=str(f.type),
                group=meta["group"],
                help=meta["help"],
                resettable=meta["resettable"],
                choices=meta["choices"],
                minimum=meta["minimum"],
                keyword=meta["keyword"] or f.name,
                path=meta["path"],
                _field=f,
            )
        )
    return tuple(out)


SETTINGS: Tuple[Setting, ...] = _settings()
BY_KEYWORD: Dict[str, Setting] = {s.keyword: s for s in SETTINGS}


def in_group(group: str) -> Tuple[Setting, ...]:
    """The settings of ``group``, in declaration order."""
    return tuple(s for s in SETTINGS if s.group == group)
