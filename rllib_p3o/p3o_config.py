"""`P3OConfig`: every setting of a P3O run, with its validation (usage: `rllib_p3o.p3o` and the README).

The config names the pieces RLlib builds for a run (RLlib's own way): the vLLM EnvRunner, the text env, the
HF causal-LM RLModule, the P3O learner and the offline-data hooks. The algorithm itself is `rllib_p3o.p3o.P3O`.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Dict, List, Optional, Type, Union

from typing_extensions import Self

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_p3o import lora as lora_specs
from rllib_p3o.chat import ChatTemplateError
from rllib_p3o.env import TextEnv, check_chat_dataset
from rllib_p3o.env_runner import VLLMEnvRunner
from rllib_p3o.losses import LOSSES
from rllib_p3o.offline_data import P3OOfflineData, P3OOfflinePreLearner
from rllib_p3o.rl_module import HFCausalLMRLModule
from rllib_p3o.sources import behavior_sample_counts, check_same_tokenizer
from rllib_p3o.torch.p3o_torch_learner import P3OTorchLearner
from rllib_p3o.weight_sync import DEFAULT_TOLERANCE

ESS_SCOPES = ("batch", "source")
LOGPROBS_MODES = ("processed", "raw")


class P3OConfig(AlgorithmConfig):
    """Configuration of the P3O algorithm (and of its GRPO/PPO-clip baseline, ``loss="grpo"``)."""

    # The Algorithm class built by default: `P3O`, set by `rllib_p3o.p3o` where that class is defined. The algorithm
    # module imports this one (RLlib's direction: an algorithm knows its config), so this one cannot import it back.
    default_algo_class: ClassVar[Optional[Type[Algorithm]]] = None

    def __init__(self, algo_class: Optional[Type[Algorithm]] = None):
        super().__init__(algo_class=algo_class or self.default_algo_class)
        # Model and objective. (`.training(model=PATH)` sets `policy_model`: `model` is RLlib's legacy model dict.)
        self.policy_model: Optional[str] = None
        self.model_dtype = "float32"
        self.trust_remote_code = False
        self.loss = "p3o"
        self.clip_low = 0.2
        self.clip_high = 0.2
        self.kl_ref_coeff = 0.0
        self.entropy_coeff = 0.0
        self.ess_scope = "batch"
        self.logprob_chunk_size = 8
        self.lora: Optional[Dict[str, Any]] = None  # `rllib_p3o.lora` spec; validate() fills in its defaults
        # Sampling.
        self.group_size = 8
        self.prompts_per_step = 16
        self.max_tokens = 64
        self.temperature = 1.0
        self.top_p = 1.0
        self.top_k = -1
        # "processed": behavior log-probs of the distribution actually sampled from (after temperature/top-p),
        # which is what the importance ratio needs when sampling at T != 1. "raw": the model's own log-probs.
        self.logprobs_mode = "processed"
        self.vllm_kwargs: Dict[str, Any] = {}
        self.verify_weight_sync = True
        # Max |learner - engine| log-prob on the probe; fp32 engines agree to ~1e-5, bf16 needs ~5e-2.
        self.weight_sync_tolerance = DEFAULT_TOLERANCE
        self.weight_sync_timeout_s = 300.0  # a runner that has not loaded new weights by then is hung: raise
        self.max_consecutive_nonfinite_steps = 3  # non-finite steps in a row (each skipped) before the run stops
        # Asynchronous sampling: runners keep generating (with weights up to `max_staleness` versions old).
        self.async_sampling = False
        self.max_staleness = 2
        # Torch/OpenMP threads per learner and per EnvRunner engine; None: from their Ray CPUs.
        self.num_threads_per_learner: Optional[int] = None
        self.num_threads_per_env_runner: Optional[int] = None
        # Frozen behavior models: [{"model": PATH, "samples": 4 (per prompt group) or "share": 0.5,
        #   "name": ..., "temperature": ..., "top_p": ..., "top_k": ..., "max_tokens": ...}, ...]
        self.behavior_models: List[Dict[str, Any]] = []
        # Offline trajectories (config.offline_data(input_=PATH)) and recording.
        self.offline_fraction: Optional[float] = None
        self.offline_skip_bad_rows = False
        self.offline_rescore_model: Optional[str] = None
        self.offline_max_seq_len = 512
        self.record_rollouts: Optional[str] = None
        self.input_read_method = "read_parquet"
        self.offline_data_class = P3OOfflineData
        self.prelearner_class = P3OOfflinePreLearner
        # Held-out evaluation (greedy), every `eval_interval` iterations; 0 disables.
        self.eval_interval = 1
        self.eval_max_prompts = 200
        # RLlib settings this algorithm relies on.
        self.lr = 1e-5
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        # Our learner skips non-finite steps itself (one fused check): RLlib need not check each tensor again.
        self.torch_skip_nan_gradients = True
        self.num_epochs = 1
        self.minibatch_size = None
        self.shuffle_batch_per_epoch = True
        self.env = TextEnv
        self.env_runner_cls = VLLMEnvRunner
        self.num_env_runners = 1
        self.num_envs_per_env_runner = 1
        # A 1-step episode per completion; the train batch size is prompts_per_step * group_size.
        self.rollout_fragment_length = 1
        # Weights are pushed to the runners by P3O itself (runner state holds no connector stats to merge).
        # Start-up: build the driver's local runner while the remote ones start their engines (RLlib waits after).
        self.validate_env_runners_after_construction = False
        self._dont_auto_sync_env_runner_states = True
        self.merge_env_runner_states = False
        self.broadcast_env_runner_states = False
        self.add_default_connectors_to_learner_pipeline = False
        self.observation_space = TextEnv.observation_space_default()
        self.action_space = TextEnv.action_space_default()

    def training(
        self,
        *,
        model: Optional[str] = NotProvided,
        model_dtype: Optional[str] = NotProvided,
        trust_remote_code: Optional[bool] = NotProvided,
        loss: Optional[str] = NotProvided,
        clip_low: Optional[float] = NotProvided,
        clip_high: Optional[float] = NotProvided,
        kl_ref_coeff: Optional[float] = NotProvided,
        entropy_coeff: Optional[float] = NotProvided,
        ess_scope: Optional[str] = NotProvided,
        logprob_chunk_size: Optional[int] = NotProvided,
        lora: Optional[Dict[str, Any]] = NotProvided,
        group_size: Optional[int] = NotProvided,
        prompts_per_step: Optional[int] = NotProvided,
        max_tokens: Optional[int] = NotProvided,
        temperature: Optional[float] = NotProvided,
        top_p: Optional[float] = NotProvided,
        top_k: Optional[int] = NotProvided,
        logprobs_mode: Optional[str] = NotProvided,
        vllm_kwargs: Optional[Dict[str, Any]] = NotProvided,
        verify_weight_sync: Optional[bool] = NotProvided,
        weight_sync_tolerance: Optional[float] = NotProvided,
        weight_sync_timeout_s: Optional[float] = NotProvided,
        max_consecutive_nonfinite_steps: Optional[int] = NotProvided,
        eval_interval: Optional[int] = NotProvided,
        eval_max_prompts: Optional[int] = NotProvided,
        async_sampling: Optional[bool] = NotProvided,
        max_staleness: Optional[int] = NotProvided,
        num_threads_per_learner: Optional[int] = NotProvided,
        num_threads_per_env_runner: Optional[int] = NotProvided,
        behavior_models: Optional[List[Dict[str, Any]]] = NotProvided,
        offline_fraction: Optional[float] = NotProvided,
        offline_skip_bad_rows: Optional[bool] = NotProvided,
        offline_rescore_model: Optional[str] = NotProvided,
        offline_max_seq_len: Optional[int] = NotProvided,
        record_rollouts: Optional[str] = NotProvided,
        **kwargs,
    ) -> Self:
        """Sets the P3O training options.

        Args:
            model: Hugging Face causal-LM directory (or hub id) of the policy; the tokenizer is loaded from it.
            model_dtype: "float32" (default), "bfloat16" or "float16", for learner and engine alike.
            trust_remote_code: Passed to transformers and vLLM; off unless asked.
            loss: A registered loss (`rllib_p3o.losses`): "p3o" (default), its ablations "p3o_no_cap" and
                "p3o_no_kl", or "grpo" (PPO-style clipped surrogate, the baseline).
            clip_low, clip_high: GRPO's ε_low/ε_high (ignored by P3O, which has no clip knob).
            kl_ref_coeff: Weight of a k3 KL to the frozen initial model (0 = off; the learner then loads it).
            entropy_coeff: Entropy bonus weight (0 = off; computing entropy needs the full vocabulary per token).
            ess_scope: Over which tokens P3O's ESS is taken. "batch" (default, the paper's): all valid tokens of the
                optimizer step's minibatch across all learners, one ESS for everything. "source": one ESS per data
                source of that minibatch (the policy's own rollouts, each behavior model, each offline source), each
                token capped and pulled by its own source's ESS; for mixtures whose parts are off-policy to very
                different degrees, such as a second model's rollouts beside fresh ones.
            logprob_chunk_size: Sequences per LM-head chunk in the learner once a batch's logits pass 64 MiB.
            lora: Train a LoRA adapter instead of all weights: ``{"r": 16, "alpha": 32, "target_modules": [...],
                "dropout": 0.0}`` (defaults as shown; target_modules: every linear layer vLLM serves adapters on).
                Runners serve the frozen base with vLLM's LoRA support and swap in each synced adapter (verified
                by the probe); syncs and checkpoints carry the adapter only; the reference KL uses the base.
            group_size: Completions sampled per prompt; advantages are normalized within each group.
            prompts_per_step: Prompts per training step (train batch = prompts_per_step * group_size rows).
            max_tokens, temperature, top_p, top_k: vLLM sampling parameters of the rollouts.
            logprobs_mode: "processed" (default: log-probs of the sampling distribution, after temperature and
                top-p/top-k, i.e. the true behavior policy) or "raw" (the model's unprocessed log-probs).
            vllm_kwargs: Extra ``vllm.LLM`` arguments (e.g. ``kv_cache_memory_bytes``, ``max_model_len``).
            verify_weight_sync: After each sync, check that the engine's log-probs on a probe sequence match the
                learner's (raises on a silent sync failure).
            weight_sync_tolerance: Largest allowed |learner - engine| log-prob on that probe.
            weight_sync_timeout_s: A runner that has not loaded new weights within this many seconds raises
                `WeightSyncError` naming it (default 300), instead of a silent hang.
            max_consecutive_nonfinite_steps: An optimizer step whose loss or gradient is not finite is skipped
                (nothing reaches the weights) and counted in ``p3o/skipped_nonfinite_steps``; after this many in a
                row (default 3) the run stops with an error naming what was not finite.
            eval_interval: Greedy held-out evaluation every this many iterations (needs ``eval_dataset`` in
                env_config); 0 disables.
            eval_max_prompts: At most this many held-out prompts per evaluation.
            async_sampling: Runners keep generating while the learners update; weights reach them without a
                pause (each runner loads them after its current sample).
            max_staleness: In async mode, policy samples more than this many weight versions behind the learner
                are dropped (and counted).
            num_threads_per_learner, num_threads_per_env_runner: Torch/OpenMP threads of each learner and each
                runner's engine; default: their Ray CPUs (see `learner_threads`, `env_runner_threads`). Async mode
                only overlaps generation and training when the budgets fit the cores (OpenMP threads spin-wait).
            behavior_models: Frozen models whose engines generate a share of every prompt group, each a dict with
                ``model`` (HF path), ``samples`` (completions per group) or ``share`` (of ``group_size``), and
                optionally ``name`` and its own ``temperature``/``top_p``/``top_k``/``max_tokens``. Their
                sampled-token log-probs are the behavior log-probs; their weights are never synced. They must use
                the policy's tokenizer.
            offline_fraction: Share of each training batch's rows taken from the offline dataset
                (``config.offline_data(input_=PATH)``); the rest are online rollouts. Default: 1.0 when an offline
                dataset is configured (offline-only), else 0.0.
            offline_skip_bad_rows: Drop (and count) invalid offline rows instead of refusing to start.
            offline_rescore_model: HF model that scores, once, offline rows without ``behavior_logprobs``.
            offline_max_seq_len: Longest prompt + completion of an offline row, in tokens.
            record_rollouts: Directory to which every sampled batch is written as trajectory Parquet.
        """
        if isinstance(model, (str, os.PathLike)):
            self.policy_model = os.fspath(model)
        elif model is not NotProvided:
            kwargs["model"] = model  # RLlib's own (old-stack) model dict
        super().training(**kwargs)
        for name, value in dict(
            model_dtype=model_dtype, trust_remote_code=trust_remote_code, loss=loss,
            clip_low=clip_low, clip_high=clip_high, kl_ref_coeff=kl_ref_coeff, entropy_coeff=entropy_coeff,
            ess_scope=ess_scope, logprob_chunk_size=logprob_chunk_size, lora=lora, group_size=group_size,
            prompts_per_step=prompts_per_step,
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, logprobs_mode=logprobs_mode,
            vllm_kwargs=vllm_kwargs, verify_weight_sync=verify_weight_sync,
            weight_sync_tolerance=weight_sync_tolerance, weight_sync_timeout_s=weight_sync_timeout_s,
            max_consecutive_nonfinite_steps=max_consecutive_nonfinite_steps, async_sampling=async_sampling,
            max_staleness=max_staleness, num_threads_per_learner=num_threads_per_learner,
            num_threads_per_env_runner=num_threads_per_env_runner, behavior_models=behavior_models, offline_fraction=offline_fraction,
            offline_skip_bad_rows=offline_skip_bad_rows, offline_rescore_model=offline_rescore_model,
            offline_max_seq_len=offline_max_seq_len, record_rollouts=record_rollouts, eval_interval=eval_interval,
            eval_max_prompts=eval_max_prompts,
        ).items():
            if value is not NotProvided:
                setattr(self, name, value)
        return self

    @property
    def resolved_offline_fraction(self) -> float:
        """Share of each training batch read from the offline dataset (``offline_fraction`` or its default)."""
        if self.offline_fraction is not None:
            return float(self.offline_fraction)
        return 1.0 if self.is_offline else 0.0

    @property
    def online_prompts_per_step(self) -> int:
        """Prompts sampled online per training step; the rest of the batch comes from the offline dataset."""
        return round((1.0 - self.resolved_offline_fraction) * self.prompts_per_step)

    @property
    def train_batch_rows(self) -> int:
        """Rows of one training batch (before filler rows for the learner shards)."""
        return self.prompts_per_step * self.group_size

    @property
    def online_rows_per_step(self) -> int:
        """Completions sampled online per training step."""
        return self.online_prompts_per_step * self.group_size

    @property
    def offline_rows_per_step(self) -> int:
        """Rows read from the offline dataset per training step: the rest of the batch."""
        return self.train_batch_rows - self.online_rows_per_step

    @property
    def learner_threads(self) -> Optional[int]:
        """Torch threads of each learner: ``num_threads_per_learner``, else its Ray CPUs (``num_cpus_per_learner``, 1
        for "auto"); a local learner gets ``num_cpus_for_main_process`` in async mode, where it runs beside the
        runners, and None (torch's default: every core) in sync mode, where it never does."""
        if self.num_threads_per_learner:
            return int(self.num_threads_per_learner)
        if self.num_learners > 0:
            return max(1, int(self.num_cpus_per_learner)) if self.num_cpus_per_learner != "auto" else 1
        if self.async_sampling and self.num_env_runners > 0:
            return max(1, int(self.num_cpus_for_main_process))
        return None

    @property
    def env_runner_threads(self) -> int:
        """Torch/OpenMP threads of each runner's engine: ``num_threads_per_env_runner``, else its Ray CPUs plus, in
        sync mode with a local learner, a share of the driver's CPUs (``num_cpus_for_main_process``), idle while the
        runners generate (the mirror of `learner_threads` taking every core)."""
        borrowed = (int(self.num_cpus_for_main_process) // self.num_env_runners
                    if not self.async_sampling and self.num_learners == 0 and self.num_env_runners > 0 else 0)
        return int(self.num_threads_per_env_runner or (max(1, int(self.num_cpus_per_env_runner)) + borrowed))

    def validate(self) -> None:
        super().validate()
        if not self.policy_model:
            self._value_error("P3OConfig needs a policy model: .training(model='/path/to/hf-causal-lm').")
        if self.loss not in LOSSES:
            self._value_error(f"Unknown loss {self.loss!r}; registered losses: {', '.join(sorted(LOSSES))}.")
        if self.ess_scope not in ESS_SCOPES:
            self._value_error(f"ess_scope must be one of {ESS_SCOPES}, got {self.ess_scope!r}.")
        if self.logprobs_mode not in LOGPROBS_MODES:
            self._value_error(f"logprobs_mode must be 'processed' or 'raw', got {self.logprobs_mode!r}.")
        if self.group_size < 2:
            self._value_error("group_size must be >= 2: advantages are normalized within each prompt group.")
        if not 0.0 <= self.resolved_offline_fraction <= 1.0:
            self._value_error(f"offline_fraction must be in [0, 1], got {self.offline_fraction}.")
        if self.resolved_offline_fraction > 0 and not self.is_offline:
            self._value_error("offline_fraction > 0 needs an offline dataset: .offline_data(input_=PATH).")
        for spec in self.behavior_models:
            if "model" not in spec:
                self._value_error(f"each behavior model needs a 'model' path, got {spec}.")
        behavior_samples = sum(behavior_sample_counts(self.behavior_models, self.group_size))
        if self.behavior_models and behavior_samples > self.group_size:
            self._value_error(f"behavior models take {behavior_samples} samples per group, more "
                              f"than group_size={self.group_size}.")
        if self.behavior_models and not self.in_evaluation:
            check_same_tokenizer(self.policy_model, [s["model"] for s in self.behavior_models],
                                 self.trust_remote_code)
        if self.async_sampling and self.num_env_runners < 1 and not self.in_evaluation:
            self._value_error("async_sampling needs remote EnvRunners (num_env_runners >= 1).")
        for name in ("num_threads_per_learner", "num_threads_per_env_runner"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                self._value_error(f"{name} must be >= 1 or None, got {getattr(self, name)}.")
        if self.minibatch_size is not None and self.minibatch_size <= 0:
            self._value_error("minibatch_size must be positive or None.")
        if self.policy_model and not self.in_evaluation:
            try:
                check_chat_dataset(self.env_config or {}, self.policy_model, self.trust_remote_code)
            except ChatTemplateError as e:
                self._value_error(str(e))
        if self.lora is not None:
            try:
                spec = lora_specs.resolve(self.lora)
                self.lora = lora_specs.validate(spec, self.policy_model, self.trust_remote_code)
            except ValueError as e:
                self._value_error(f"lora: {e}")

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=HFCausalLMRLModule, model_config=self.lm_model_config())

    def lm_model_config(self) -> Dict[str, Any]:
        """The RLModule's ``model_config`` (see `HFCausalLMRLModule`)."""
        return {"model": self.policy_model, "dtype": self.model_dtype, "trust_remote_code": self.trust_remote_code,
                "logprob_chunk_size": self.logprob_chunk_size, "compute_entropy": self.entropy_coeff > 0,
                "lora": self.lora}

    def get_default_learner_class(self) -> Union[Type[Learner], str]:
        return P3OTorchLearner

    @property
    def _model_config_auto_includes(self) -> Dict[str, Any]:
        # Users can still override any key through `.rl_module(model_config=...)`.
        return super()._model_config_auto_includes | self.lm_model_config()
