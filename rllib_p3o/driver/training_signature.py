"""The signature of ``P3OConfig.training``: one keyword argument per P3O setting, with its type and default.

Generated from `rllib_p3o.core.settings` by ``make reference`` (`devtools.reference`): do not edit by hand;
``tests/test_settings.py`` fails when it is stale. ``P3OConfig`` inherits ``training`` from here, so that ``help()`` and
an IDE show every setting; the work is ``P3OConfig._set_training``'s.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ray.rllib.algorithms.algorithm_config import NotProvided
from typing_extensions import Self


class TrainingSignature:
    """``training`` with every P3O setting as a keyword argument (`rllib_p3o.core.settings`)."""

    def training(
        self,
        *,
        model: Optional[str] = NotProvided,
        trust_remote_code: bool = NotProvided,
        lora: Optional[Dict[str, Any]] = NotProvided,
        logprob_chunk_size: int = NotProvided,
        fused_head: str = NotProvided,
        loss: str = NotProvided,
        loss_config: Dict[str, Any] = NotProvided,
        kl_ref_coeff: float = NotProvided,
        entropy_coeff: float = NotProvided,
        max_consecutive_nonfinite_steps: int = NotProvided,
        group_size: int = NotProvided,
        prompts_per_step: int = NotProvided,
        max_tokens: int = NotProvided,
        temperature: float = NotProvided,
        top_p: float = NotProvided,
        top_k: int = NotProvided,
        kept_set_cap: int = NotProvided,
        logprobs_mode: str = NotProvided,
        vllm_kwargs: Dict[str, Any] = NotProvided,
        async_sampling: bool = NotProvided,
        max_staleness: int = NotProvided,
        inflight_weight_updates: bool = NotProvided,
        inflight_kv_cache: str = NotProvided,
        behavior_models: List[Dict[str, Any]] = NotProvided,
        dynamic_sampling: bool = NotProvided,
        dynamic_sampling_max_rounds: int = NotProvided,
        overlong_buffer: int = NotProvided,
        overlong_penalty: float = NotProvided,
        overlong_prompts: str = NotProvided,
        log_completions: int = NotProvided,
        verify_weight_sync: bool = NotProvided,
        weight_sync_tolerance: Optional[float] = NotProvided,
        weight_sync_rtol: Optional[float] = NotProvided,
        weight_sync_timeout_s: float = NotProvided,
        eval_interval: int = NotProvided,
        eval_max_prompts: int = NotProvided,
        eval_temperature: float = NotProvided,
        eval_samples_per_prompt: int = NotProvided,
        offline_fraction: Optional[float] = NotProvided,
        offline_skip_bad_rows: bool = NotProvided,
        offline_rescore_model: Optional[str] = NotProvided,
        offline_max_seq_len: int = NotProvided,
        offline_reader: str = NotProvided,
        offline_provenance: Any = NotProvided,
        offline_shuffle: bool = NotProvided,
        record_rollouts: Optional[str] = NotProvided,
        precision: Optional[str] = NotProvided,
        rollout_dtype: Optional[str] = NotProvided,
        rollout_quantization: Optional[str] = NotProvided,
        num_threads_per_learner: Optional[int] = NotProvided,
        num_threads_per_env_runner: Optional[int] = NotProvided,
        **kwargs: Any,
    ) -> Self:
        """Sets the training options: P3O's own (below; their meaning: the configuration reference,
        docs/reference/configuration.md) and RLlib's (``lr``, ``grad_clip``, ``num_epochs``, ``minibatch_size``, ...).
        A key left out keeps its value; an unknown key raises TypeError, as RLlib's ``training`` does. Relative paths
        (``model``, ``behavior_models``' models, ``offline_rescore_model``, ``record_rollouts``) are resolved here,
        where the script runs.

        P3O's settings (group, then key (type, default): what it does):

            Model:
                model (Optional[str], default None): Hugging Face causal-LM directory (or hub id) of the policy; the
                    tokenizer is loaded from it. A relative directory is made absolute by `.training()` (Tune runs
                    each trial in a directory of its own); a path that is neither a directory nor a hub id fails
                    validation, naming it.
                trust_remote_code (bool, default False): Passed to transformers and vLLM; off unless asked.
                lora (Optional[Dict[str, Any]], default None): Train a LoRA adapter instead of all weights: `{"r":
                    16, "alpha": 32, "target_modules": [...], "dropout": 0.0}` (defaults as shown; target_modules:
                    every linear layer vLLM serves adapters on). Runners serve the frozen base with vLLM's LoRA
                    support and swap in each synced adapter (verified by the probe); syncs and checkpoints carry the
                    adapter only; the reference KL uses the base.
                logprob_chunk_size (int, default 8): Sequences per LM-head chunk in the learner once a batch's
                    logits pass 64 MiB (the chunked head: `fused_head`).
                fused_head (str, default "auto"): How the learner turns the last hidden states into token log-probs.
                    "on": the fused head (`rllib_p3o.learner.fused_head`): log π(y) = z_y − logsumexp(z), z = h·Wᵀ +
                    b, 1024 tokens at a time from the hidden states and the head's weight, so the logits of a whole
                    batch (and their gradient) never exist; equal to the full-logits head within 1e-5 in float32,
                    and on a CPU at Qwen's vocabulary (151,936) its peak memory was 0.30-0.43x the chunked head's
                    and its time 0.24-0.46x. Refused, with the reason, where it cannot serve: an LM head that is not
                    a plain `torch.nn.Linear` (an adapter, a quantized or hooked head: its weight alone is not the
                    head); a model whose logits are not `lm_head(h)`, or `cap·tanh(lm_head(h)/cap)` with `cap` its
                    `final_logit_softcapping` (another scale or soft-cap, seen when the learner checks the model at
                    start); `entropy_coeff` > 0 (it computes no entropy). "auto" (the default): off CUDA, the fused
                    head where "on" would serve and the batch's float32 logits pass 64 MiB (where the chunked head
                    would run them in chunks); on CUDA the chunked head, faster there (on an H200 the fused head's
                    learner step took 1.05-1.19x the time and 0.58-0.83x the peak memory: use "on" where memory
                    binds); everywhere else exactly "off", so smaller batches (all of the tiny models' runs) compute
                    as before. "off": the chunked head: the head's logits, log-softmax and gather per
                    `logprob_chunk_size` sequences under activation checkpointing once the logits pass 64 MiB, in
                    one piece below (and the model's whole forward where `lm_head(h)` is not its logits).
            Losses:
                loss (str, default "p3o"): A registered loss (`rllib_p3o.core.losses`); the losses and their
                    settings are listed below.
                loss_config (Dict[str, Any], default {}): The loss's own settings, e.g. `{"clip_low": 0.2,
                    "clip_high": 0.28}` for `grpo` or `{"kl_estimator": "k3_is"}` for `p3o`; validation builds the
                    loss's settings dataclass from it, so an unknown key or a value the loss refuses fails before
                    anything starts.
                kl_ref_coeff (float, default 0.0): Weight of a k3 KL to the frozen initial model (0 = off; the
                    learner then loads it).
                entropy_coeff (float, default 0.0): Entropy bonus weight (0 = off; computing entropy needs the full
                    vocabulary per token).
                max_consecutive_nonfinite_steps (int, default 3): An optimizer step whose loss or gradient is not
                    finite is skipped (nothing reaches the weights) and counted in `p3o/skipped_nonfinite_steps`;
                    after this many in a row the run stops with an error naming what was not finite.
            Sampling:
                group_size (int, default 8): Completions sampled per prompt; advantages are normalized within each
                    group (so at least 2).
                prompts_per_step (int, default 16): Prompts per training step (train batch = prompts_per_step *
                    group_size).
                max_tokens (int, default 64): Most tokens per completion (per model turn in multi-turn episodes);
                    vLLM's `max_tokens`.
                temperature (float, default 1.0): Sampling temperature of the rollouts.
                top_p (float, default 1.0): Nucleus-sampling threshold of the rollouts (1.0: off).
                top_k (int, default -1): Top-k sampling of the rollouts (-1: off).
                kept_set_cap (int, default 64): Top-k/top-p sampling with processed log-probs: each generated token
                    records its kept set (the tokens the sampler kept, up to this many; vLLM returns them as the top
                    candidates of the processed distribution) and the learner renormalizes its log-prob over that
                    set, so the ratio compares the same truncated distribution. A token whose kept set is larger
                    (top-p only) is left out of the loss (`kept_set_overflow_share`). With top-k alone it must be at
                    least `top_k`. 0: record nothing (P3O's losses then refuse truncated sampling).
                logprobs_mode (str, default "processed"): "processed": log-probs of the sampling distribution, after
                    temperature and top-p/top-k, i.e. the true behavior policy, which the importance ratio needs
                    when sampling at T != 1; "raw": the model's own.
                vllm_kwargs (Dict[str, Any], default {}): Extra `vllm.LLM` arguments (e.g. `kv_cache_memory_bytes`,
                    `max_model_len`).
                async_sampling (bool, default False): Runners keep generating while the learners update; weights
                    reach them without a pause (each runner loads them after its current sample). Needs remote
                    EnvRunners. The data are up to as many versions old as sample() calls each runner has in flight:
                    RLlib's env_runners(max_requests_in_flight_per_env_runner=k), 1 by default (one version old);
                    more keeps the engines busier at the price of staler data.
                max_staleness (int, default 2): In async mode, policy samples more than this many weight versions
                    behind the learner are dropped (and counted); a completion's staleness is its oldest token's.
                inflight_weight_updates (bool, default False): Async mode only: new weights reach the sequences a
                    runner is generating. Each runner keeps more prompt groups in its engine than one sample
                    returns, returns the first to finish and continues the others after the next weight load,
                    between two engine steps, so a completion may span weight versions (each token's version is
                    recorded as `policy_version` and its behavior log-prob is that version's). Single-turn policy
                    rollouts with the in-process vLLM engine; not with multi-turn environments, behavior models or
                    LoRA.
                inflight_kv_cache (str, default "recompute"): With `inflight_weight_updates`: what new weights do to
                    the KV cache of a running sequence's prefix. "recompute": the sequence is prefilled again with
                    the new weights, so each later token is sampled exactly from its version given its prefix;
                    "keep" (PipelineRL's): the old-weight KV stays, which saves the prefill but samples later tokens
                    from the new weights attending to old-weight keys and values (the engine then runs without a
                    prefix cache).
                behavior_models (List[Dict[str, Any]], default []): Frozen models whose engines generate a share of
                    every prompt group, each a dict with `model` (HF path), `samples` (completions per group) or
                    `share` (of `group_size`), and optionally `name` and its own
                    `temperature`/`top_p`/`top_k`/`max_tokens`. Their sampled-token log-probs are the behavior
                    log-probs; their weights are never synced. They must use the policy's tokenizer.
                dynamic_sampling (bool, default False): DAPO's dynamic sampling (verl's `filter_groups`): prompt
                    groups whose rewards are all equal (no signal) are left out and more groups are sampled until
                    the step has `prompts_per_step` groups with signal, for at most `dynamic_sampling_max_rounds`
                    extra rounds (then groups without signal fill the step). The left-out groups' prompts count as
                    drawn (resume continues after them). In async mode they are left out of the chunks and more
                    chunks are taken.
                dynamic_sampling_max_rounds (int, default 8): With `dynamic_sampling`, extra sampling rounds per
                    step at most (sync mode).
                overlong_buffer (int, default 0): DAPO's overlong shaping (verl's `overlong_buffer.len`): a model
                    turn longer than `max_tokens` minus this many tokens gets a penalty growing linearly to
                    `overlong_penalty` at `max_tokens` (a multi-turn episode: its longest turn); added to the reward
                    before advantages. 0: off.
                overlong_penalty (float, default 1.0): With `overlong_buffer`, the penalty at `max_tokens` (verl's
                    `overlong_buffer.penalty_factor`).
                overlong_prompts (str, default "error"): A prompt longer than the model's context minus `max_tokens`
                    (chat template applied): `"error"` names its dataset, row and length when the config is
                    validated, before any engine starts; `"drop"` leaves such rows out (verl's
                    `filter_overlong_prompts`); `"truncate_left"` keeps their last tokens (TRL's
                    `max_prompt_length`, left). Metrics `prompts_dropped` and `prompts_truncated` count them.
                log_completions (int, default 0): Rows of sample completions written after each iteration to `<trial
                    dir>/completions/iter_<iteration>.parquet`: prompt, completion, reward, each reward function's
                    value, advantage and source, whole prompt groups (TRL's `log_completions`); 0 writes none.
            Sync:
                verify_weight_sync (bool, default True): After each sync, check that the engine's log-probs on a
                    probe sequence match the learner's (raises on a silent sync failure).
                weight_sync_tolerance (Optional[float], default None): Largest allowed |learner - engine| log-prob
                    on that probe. The learner scores the probe with the weights exactly as sent (cast to
                    `rollout_dtype`, FP8-rounded if simulated), so what is left is the engine's kernel numerics. It
                    bounds the mean difference over the probe's tokens, and each token's together with
                    `weight_sync_rtol`. None: by the engine's precision, 1e-3 for float32 and 0.08 for bfloat16
                    (`rllib_p3o.sync.payload.DEFAULT_TOLERANCES`).
                weight_sync_rtol (Optional[float], default None): A probe token may differ by
                    `weight_sync_tolerance` plus this times its |log-prob|: a low-precision engine's rounding error
                    grows with the magnitude (with rtol > 0, up to 10% of the tokens may exceed that by up to twice
                    it: `rllib_p3o.sync.probe.check_probe`). None: 0 for float32 engines, 0.1 for bfloat16.
                weight_sync_timeout_s (float, default 300.0): A runner that has not loaded new weights within this
                    many seconds raises `WeightSyncError` naming it, instead of a silent hang.
            Evaluation:
                eval_interval (int, default 1): Held-out evaluation every this many iterations (needs `eval_dataset`
                    in env_config); 0 disables.
                eval_max_prompts (int, default 200): At most this many held-out prompts per evaluation.
                eval_temperature (float, default 0.0): Sampling temperature of the held-out evaluation; 0 answers
                    greedily. Above 0, the reported held-out reward is the mean over `eval_samples_per_prompt`
                    samples per prompt (the avg@k of LLM-RL papers).
                eval_samples_per_prompt (int, default 1): Completions per held-out prompt when `eval_temperature` >
                    0.
            Offline:
                offline_fraction (Optional[float], default None): Share of each training batch's rows taken from the
                    offline dataset (`config.offline_data(input_=PATH)`); the rest are online rollouts. None: 1.0
                    when an offline dataset is configured (offline-only), else 0.0.
                offline_skip_bad_rows (bool, default False): Drop (and count) invalid offline rows instead of
                    refusing to start.
                offline_rescore_model (Optional[str], default None): HF model that scores, once, offline rows
                    without `behavior_logprobs`.
                offline_max_seq_len (int, default 512): Longest prompt + completion of an offline row, in tokens.
                offline_reader (str, default "auto"): Who reads the offline data. `"ray_data"`: Ray Data tasks and
                    prelearner actors beside the trial, which need CPUs the trial does not hold (the prelearner
                    actors' `map_batches_kwargs` CPUs + 1; 3 by default); a cluster without them is refused before
                    the trial starts. `"in_process"`: the trial's own process, all rows in memory (the same batches;
                    for a laptop). `"auto"`: Ray Data when the cluster has those CPUs, else in process.
                offline_provenance (Any, default "auto"): Whose data each offline input is
                    (`rllib_p3o.data.provenance`). `"auto"`: a row whose recorded `model_fingerprint` is the
                    policy's lineage (the weights the run starts from, or a model it was exported from) is the
                    policy's own, gets the trust region and a KL pull toward its sampler; every other row, and every
                    row of a file that records no model (third-party data), is another model's and gets what a
                    behavior model's live rows get (no trust region; the weight `other_model_weight` names; under
                    `kl_anchor="auto"` the KL toward π_old, never toward the recorder). `"policy"` or `"other"`:
                    that answer for every input; or a dict `{input path: "policy" | "other"}` for some inputs (a
                    file or a directory of them; the others `"auto"`). `rllib-p3o validate --model MODEL` and the
                    run's first lines say how each file is read.
                offline_shuffle (bool, default True): Read the offline rows in an order drawn from the run's `seed`
                    (a new order each pass over the data; a restored run draws the same), so that two seeds train on
                    different batches. False: in file order, every seed alike. With `offline_reader="ray_data"` the
                    order is Ray Data's `random_shuffle` with the seed, the same on every pass.
                record_rollouts (Optional[str], default None): Directory to which every sampled batch is written as
                    trajectory Parquet: a local path (a relative one is made absolute by `.training()`, not inside a
                    Tune trial's directory) or a URI pyarrow's filesystems open (`s3://bucket/traj`, `gs://...`,
                    `hdfs://...`); a scheme pyarrow has no filesystem for is refused.
            Precision:
                precision (Optional[str], default None): The learner's precision: "fp32" (also when None),
                    "bf16-mixed" (float32 master weights and optimizer state, forward and backward under bfloat16
                    autocast; checkpoints hold the float32 weights), "bf16" (pure bfloat16: weights and Adam's state
                    in bfloat16) or "fp16" (pure float16).
                rollout_dtype (Optional[str], default None): The dtype the vLLM engines run in: "float32",
                    "bfloat16" or "float16". None: the learner's compute dtype (bfloat16 under "bf16-mixed").
                    Weights are cast to it before each sync; the behavior log-probs are the engine's, so the ratio
                    carries the precision gap.
                rollout_quantization (Optional[str], default None): FP8 rollouts. "fp8": vLLM's FP8 quantization of
                    the engine's linear layers, re-quantized from every sync (GPU only). "fp8_simulated": every
                    linear weight is rounded through float8_e4m3fn with one scale per output channel before it is
                    loaded, and the engine computes in `rollout_dtype` (works on CPU). Not with LoRA.
            Resources:
                num_threads_per_learner (Optional[int], default None): Torch/OpenMP threads of each learner; None:
                    its Ray CPUs (`P3OConfig.learner_threads`). Async mode only overlaps generation and training
                    when the thread budgets fit the cores (OpenMP threads spin-wait).
                num_threads_per_env_runner (Optional[int], default None): Torch/OpenMP threads of each runner's
                    engine; None: its Ray CPUs (`P3OConfig.env_runner_threads`).
        """
        settings: Dict[str, Any] = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        return self._set_training(settings, kwargs)  # type: ignore[attr-defined]
