"""P3O: batch-adaptive policy-gradient post-training of language models, as an RLlib Algorithm.

    from rllib_p3o import P3OConfig
    config = (
        P3OConfig()
        .environment(env_config={"dataset": "prompts.jsonl", "reward_fn": my_reward})
        .training(model="/path/to/hf-model", loss="p3o", group_size=8, prompts_per_step=32, max_tokens=64, lr=1e-5)
        .env_runners(num_env_runners=1)
        .learners(num_learners=1)
    )
    algo = config.build_algo()
    algo.train()

One ``training_step``: the vLLM EnvRunners sample ``group_size`` completions for each of ``prompts_per_step``
prompts → group-normalized advantages over each prompt's completions (before sharding across learners) → one
padded token batch → ``learner_group.update`` (``num_epochs`` × minibatches of ``minibatch_size`` rows per learner)
→ the new weights are loaded into every runner's engine in place → metrics.

ESS scope: the objective's ESS is computed over one optimizer step's minibatch across all learners. With the
default (no ``minibatch_size``, one epoch) that is the whole training batch of the iteration.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Type, Union

import numpy as np
import ray
import torch
from typing_extensions import Self

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from rllib_p3o import batching
from rllib_p3o.env import TextEnv
from rllib_p3o.episodes import episodes_to_records
from rllib_p3o.objectives import group_advantages, groups_without_signal

if TYPE_CHECKING:
    from ray.rllib.core.learner.learner import Learner

logger = logging.getLogger(__name__)

LOSSES = ("p3o", "grpo")
ESS_SCOPES = ("batch", "source")


class P3OConfig(AlgorithmConfig):
    """Configuration of the P3O algorithm (and of its GRPO/PPO-clip baseline, ``loss="grpo"``)."""

    def __init__(self, algo_class: Optional[Type["P3O"]] = None):
        super().__init__(algo_class=algo_class or P3O)
        from rllib_p3o.env_runner import VLLMEnvRunner

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
        self.weight_sync_tolerance = 1e-3
        # Asynchronous sampling: runners keep generating (with weights up to `max_staleness` versions old).
        self.async_sampling = False
        self.max_staleness = 2
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
        from rllib_p3o.offline_data import P3OOfflineData, P3OOfflinePreLearner

        self.offline_data_class = P3OOfflineData
        self.prelearner_class = P3OOfflinePreLearner
        # Held-out evaluation (greedy), every `eval_interval` iterations; 0 disables.
        self.eval_interval = 1
        self.eval_max_prompts = 200
        # RLlib settings this algorithm relies on.
        self.lr = 1e-5
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
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
        eval_interval: Optional[int] = NotProvided,
        eval_max_prompts: Optional[int] = NotProvided,
        async_sampling: Optional[bool] = NotProvided,
        max_staleness: Optional[int] = NotProvided,
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
            loss: "p3o" (default) or "grpo" (PPO-style clipped surrogate, the baseline).
            clip_low, clip_high: GRPO's ε_low/ε_high (ignored by P3O, which has no clip knob).
            kl_ref_coeff: Weight of a k3 KL to the frozen initial model (0 = off; the learner then loads it).
            entropy_coeff: Entropy bonus weight (0 = off; computing entropy needs the full vocabulary per token).
            ess_scope: Over which tokens P3O's ESS is taken. "batch" (default, the paper's): all valid tokens of the
                optimizer step's minibatch across all learners, one ESS for everything. "source": one ESS per data
                source of that minibatch (the policy's own rollouts, each behavior model, each offline source), each
                token capped and pulled by its own source's ESS; for mixtures whose parts are off-policy to very
                different degrees, such as a second model's rollouts beside fresh ones.
            logprob_chunk_size: Sequences per LM-head chunk in the learner (bounds full-vocabulary logits memory).
            group_size: Completions sampled per prompt; advantages are normalized within each group.
            prompts_per_step: Prompts per training step (train batch = prompts_per_step * group_size rows).
            max_tokens, temperature, top_p, top_k: vLLM sampling parameters of the rollouts.
            logprobs_mode: "processed" (default: log-probs of the sampling distribution, after temperature and
                top-p/top-k, i.e. the true behavior policy) or "raw" (the model's unprocessed log-probs).
            vllm_kwargs: Extra ``vllm.LLM`` arguments (e.g. ``kv_cache_memory_bytes``, ``max_model_len``).
            verify_weight_sync: After each sync, check that the engine's log-probs on a probe sequence match the
                learner's (raises on a silent sync failure).
            weight_sync_tolerance: Largest allowed |learner - engine| log-prob on that probe.
            eval_interval: Greedy held-out evaluation every this many iterations (needs ``eval_dataset`` in
                env_config); 0 disables.
            eval_max_prompts: At most this many held-out prompts per evaluation.
            async_sampling: Runners keep generating while the learners update; weights reach them without a
                pause (each runner loads them after its current sample).
            max_staleness: In async mode, policy samples more than this many weight versions behind the learner
                are dropped (and counted).
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
            ess_scope=ess_scope, logprob_chunk_size=logprob_chunk_size, group_size=group_size,
            prompts_per_step=prompts_per_step,
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, logprobs_mode=logprobs_mode,
            vllm_kwargs=vllm_kwargs, verify_weight_sync=verify_weight_sync,
            weight_sync_tolerance=weight_sync_tolerance, async_sampling=async_sampling,
            max_staleness=max_staleness, behavior_models=behavior_models, offline_fraction=offline_fraction,
            offline_skip_bad_rows=offline_skip_bad_rows, offline_rescore_model=offline_rescore_model,
            offline_max_seq_len=offline_max_seq_len, record_rollouts=record_rollouts, eval_interval=eval_interval,
            eval_max_prompts=eval_max_prompts,
        ).items():
            if value is not NotProvided:
                setattr(self, name, value)
        return self

    @property
    def resolved_offline_fraction(self) -> float:
        if self.offline_fraction is not None:
            return float(self.offline_fraction)
        return 1.0 if self.is_offline else 0.0

    @property
    def online_prompts_per_step(self) -> int:
        """Prompts sampled online per training step; the rest of the batch comes from the offline dataset."""
        return round((1.0 - self.resolved_offline_fraction) * self.prompts_per_step)

    @property
    def train_batch_rows(self) -> int:
        return self.prompts_per_step * self.group_size

    def validate(self) -> None:
        super().validate()
        if not self.policy_model:
            self._value_error("P3OConfig needs a policy model: .training(model='/path/to/hf-causal-lm').")
        if self.loss not in LOSSES:
            self._value_error(f"loss must be one of {LOSSES}, got {self.loss!r}.")
        if self.ess_scope not in ESS_SCOPES:
            self._value_error(f"ess_scope must be one of {ESS_SCOPES}, got {self.ess_scope!r}.")
        if self.logprobs_mode not in ("processed", "raw"):
            self._value_error(f"logprobs_mode must be 'processed' or 'raw', got {self.logprobs_mode!r}.")
        if self.group_size < 2 and self.loss in LOSSES:
            self._value_error("group_size must be >= 2: advantages are normalized within each prompt group.")
        if not 0.0 <= self.resolved_offline_fraction <= 1.0:
            self._value_error(f"offline_fraction must be in [0, 1], got {self.offline_fraction}.")
        if self.resolved_offline_fraction > 0 and not self.is_offline:
            self._value_error("offline_fraction > 0 needs an offline dataset: .offline_data(input_=PATH).")
        for spec in self.behavior_models:
            if "model" not in spec:
                self._value_error(f"each behavior model needs a 'model' path, got {spec}.")
        if self.behavior_models and sum(behavior_sample_counts(self)) > self.group_size:
            self._value_error(f"behavior models take {sum(behavior_sample_counts(self))} samples per group, more "
                              f"than group_size={self.group_size}.")
        if self.behavior_models and not self.in_evaluation:
            check_same_tokenizer(self.policy_model, [s["model"] for s in self.behavior_models],
                                 self.trust_remote_code)
        if self.async_sampling and self.num_env_runners < 1 and not self.in_evaluation:
            self._value_error("async_sampling needs remote EnvRunners (num_env_runners >= 1).")
        if self.minibatch_size is not None and self.minibatch_size <= 0:
            self._value_error("minibatch_size must be positive or None.")

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from rllib_p3o.rl_module import HFCausalLMRLModule

        return RLModuleSpec(module_class=HFCausalLMRLModule, model_config=self.lm_model_config())

    def lm_model_config(self) -> Dict[str, Any]:
        return {
            "model": self.policy_model,
            "dtype": self.model_dtype,
            "trust_remote_code": self.trust_remote_code,
            "logprob_chunk_size": self.logprob_chunk_size,
            "compute_entropy": self.entropy_coeff > 0,
        }

    def get_default_learner_class(self) -> Union[Type["Learner"], str]:
        from rllib_p3o.torch.p3o_torch_learner import P3OTorchLearner

        return P3OTorchLearner

    @property
    def _model_config_auto_includes(self) -> Dict[str, Any]:
        # Users can still override any key through `.rl_module(model_config=...)`.
        return super()._model_config_auto_includes | self.lm_model_config()


def behavior_sample_counts(config: "P3OConfig") -> List[int]:
    """Completions per prompt group generated by each behavior model (``samples``, or ``share`` of group_size)."""
    counts = []
    for spec in config.behavior_models:
        n = spec["samples"] if "samples" in spec else round(float(spec.get("share", 0.5)) * config.group_size)
        counts.append(int(n))
    return counts


def check_same_tokenizer(policy: str, others: List[str], trust_remote_code: bool = False) -> None:
    """Raise if a behavior model's tokenizer differs from the policy's (its token ids would mean other tokens)."""
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(policy, trust_remote_code=trust_remote_code)
    ref_vocab = ref.get_vocab()
    for other in others:
        tok = AutoTokenizer.from_pretrained(other, trust_remote_code=trust_remote_code)
        vocab = tok.get_vocab()
        if vocab != ref_vocab or tok.eos_token_id != ref.eos_token_id:
            differing = len(set(vocab.items()) ^ set(ref_vocab.items()))
            raise ValueError(
                f"behavior model {other} uses a different tokenizer than the policy model {policy} "
                f"(vocabulary sizes {len(vocab)} vs {len(ref_vocab)}, {differing} differing entries, eos "
                f"{tok.eos_token_id} vs {ref.eos_token_id}); its sampled token ids and log-probs would not refer to "
                f"the policy's tokens.")


class P3O(Algorithm):
    """The P3O algorithm; see the module docstring for one training step."""

    @classmethod
    def get_default_config(cls) -> P3OConfig:
        return P3OConfig()

    def setup(self, config: P3OConfig) -> None:
        super().setup(config)
        self._rng = np.random.default_rng(config.seed)
        self._weights_seq_no = 0
        self._rows_trained = 0
        self._pad_id = self._sampling_runner_call("pad_token_id")
        self._has_engine = bool(self._sampling_runner_call("has_engine"))
        self._probe_ids = (self._sampling_runner_call("probe_token_ids")
                           if config.verify_weight_sync and self._has_engine else None)
        self._source_names = {"online"} | set(getattr(self.offline_data, "source_names", set()))
        self._recorder = None
        if config.record_rollouts:
            from rllib_p3o.offline import TrajectoryRecorder

            self._recorder = TrajectoryRecorder(config.record_rollouts)
        self._async_chunks: List[List[Dict[str, Any]]] = []
        self._dropped_stale_lifetime = 0
        self._last_sync_stats: Dict[str, float] = {}
        from rllib_p3o.env_runner import behavior_source_name

        self._source_names |= {behavior_source_name(spec) for spec in config.behavior_models}
        self._sync_weights(blocking=True)

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _sampling_runners(self) -> bool:
        return self.env_runner_group.num_remote_env_runners() > 0

    def _foreach_sampling_runner(self, fn) -> List[Any]:
        """Run ``fn`` on every sampling runner; raise if any runner failed (RLlib would only log it)."""
        if not self._sampling_runners():
            return [fn(self.env_runner)]
        expected = self.env_runner_group.num_remote_env_runners()
        results = self.env_runner_group.foreach_env_runner(fn, local_env_runner=False)
        if len(results) != expected or self.env_runner_group.num_healthy_remote_workers() < expected:
            raise RuntimeError(f"{expected - len(results)} of {expected} EnvRunners failed; see the actor errors "
                               "above (engine start-up, weight sync or reward function).")
        return results

    def _sampling_runner_call(self, method: str, *args, **kwargs):
        """Call a runner method on the first sampling runner (remote if any, else the local one)."""
        if self._sampling_runners():
            return self.env_runner_group.foreach_env_runner(
                lambda r: getattr(r, method)(*args, **kwargs), remote_worker_ids=[1], local_env_runner=False)[0]
        return getattr(self.env_runner, method)(*args, **kwargs)

    def _sync_weights(self, blocking: Optional[bool] = None) -> Dict[str, float]:
        """Push the learner's weights into every runner's engine (in place) and return sync stats.

        In async mode the push does not wait: each runner loads the weights after its current sample() (Ray actors
        are serial), and a runner that still has an older push queued skips this one (latest wins). Errors of
        earlier pushes (e.g. a failed probe check) are raised here when their results come back.
        """
        self._weights_seq_no += 1
        state = self.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                             inference_only=True)[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
        payload = {"rl_module": ray.put(state), "weights_seq_no": self._weights_seq_no}
        if self._probe_ids is not None:
            probe_ids = self._probe_ids
            results = self.learner_group.foreach_learner(
                lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().sequence_logprobs(probe_ids))
            payload["probe"] = {"token_ids": probe_ids, "logprobs": [r.get() for r in results][0]}
            payload["tolerance"] = self.config.weight_sync_tolerance
        if blocking is None:
            blocking = not (self.config.async_sampling and self._sampling_runners())
        if not blocking:
            for _, stats in self.env_runner_group.fetch_ready_async_reqs(tags="sync", timeout_seconds=0.0):
                self._last_sync_stats = stats
            self.env_runner_group.foreach_env_runner_async(lambda r: r.load_policy_weights(payload), tag="sync")
            return dict(self._last_sync_stats)
        results = self._foreach_sampling_runner(lambda r: r.load_policy_weights(payload))
        return {k: float(np.max([res[k] for res in results])) for k in results[0]} if results else {}

    # -- one iteration -------------------------------------------------------------------------------------------

    def training_step(self) -> None:
        cfg: P3OConfig = self.config
        it = int(self.iteration or 0)  # iterations done so far; this one is it + 1
        if cfg.eval_interval and (it == 0 or (it + 1) % cfg.eval_interval == 0):
            self._log_heldout()  # the policy as it is at the start of this iteration (iteration 1: untrained)
        t0 = time.perf_counter()
        timings: Dict[str, float] = {}
        parts, records = [], []

        if self._num_online_prompts() > 0:
            with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
                records = self._sample_online()
            timings["time_generate_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            self._add_group_advantages(records)
            if self._recorder is not None:
                self._recorder.write(records, iteration=int(self.iteration or 0))
            parts.append(batching.pad_records(records, pad_id=self._pad_id))
            timings["time_batching_s"] = time.perf_counter() - t1
        if self._num_offline_rows() > 0:
            t1 = time.perf_counter()
            parts.append(self._sample_offline())
            timings["time_offline_read_s"] = time.perf_counter() - t1

        batch = batching.concat_padded(parts, pad_id=self._pad_id)
        batch = batching.shuffle_rows(batch, self._rng)
        batch = batching.pad_rows_to_multiple(batch, max(1, cfg.num_learners) * (cfg.minibatch_size or 1))

        t2 = time.perf_counter()
        per_learner_ess = self._learn(batch)
        timings["time_train_s"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            sync_stats = self._sync_weights()
        timings["time_sync_s"] = time.perf_counter() - t3
        timings["time_other_s"] = time.perf_counter() - t0 - sum(timings.values())
        self._log_step(records, batch, timings, sync_stats, per_learner_ess)

    # -- pieces of one step -------------------------------------------------------------------------------------

    def _num_online_prompts(self) -> int:
        return self.config.online_prompts_per_step

    def _num_offline_rows(self) -> int:
        return self.config.train_batch_rows - self._num_online_prompts() * self.config.group_size

    def _sample_online(self) -> List[Dict[str, Any]]:
        cfg = self.config
        if cfg.async_sampling:
            return self._sample_online_async()
        episodes, runner_metrics = synchronous_parallel_sample(
            worker_set=self.env_runner_group,
            max_env_steps=self._num_online_prompts() * cfg.group_size,
            sample_timeout_s=cfg.sample_timeout_s,
            _uses_new_env_runners=True,
            _return_metrics=True,
        )
        if not episodes:
            raise RuntimeError("No completions were sampled: an EnvRunner failed (see the errors above) or "
                               f"sampling took longer than sample_timeout_s={cfg.sample_timeout_s}.")
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        records = episodes_to_records(episodes)
        for r in records:
            r["staleness"] = self._weights_seq_no - r["weights_seq_no"] if r["source_id"] == 0 else -1
        return records

    def _arm_samplers(self) -> None:
        # At most one sample() in flight per runner (RLlib's per-actor, per-tag in-flight limit).
        self.env_runner_group.foreach_env_runner_async(lambda r: (r.sample(), r.get_metrics()), tag="sample")

    def _sample_online_async(self) -> List[Dict[str, Any]]:
        """Take whole sample() chunks from the runners, which never stop generating; drop stale ones."""
        cfg = self.config
        need = self._num_online_prompts() * cfg.group_size
        t0 = time.perf_counter()
        taken: List[Dict[str, Any]] = []
        dropped = 0
        while True:
            while self._async_chunks and len(taken) < need:
                chunk = self._async_chunks.pop(0)
                version = max((r["weights_seq_no"] for r in chunk if r["source_id"] == 0), default=None)
                staleness = self._weights_seq_no - version if version is not None else 0
                if staleness > cfg.max_staleness:
                    dropped += len(chunk)  # the whole chunk: its prompt groups stay whole
                    continue
                for r in chunk:
                    r["staleness"] = staleness if r["source_id"] == 0 else -1
                taken += chunk
            if len(taken) >= need:
                break
            self._arm_samplers()
            for _, (episodes, runner_metrics) in self.env_runner_group.fetch_ready_async_reqs(
                    tags="sample", timeout_seconds=0.02):
                self.metrics.aggregate([runner_metrics], key=ENV_RUNNER_RESULTS)
                self._async_chunks.append(episodes_to_records(episodes))
            if time.perf_counter() - t0 > cfg.sample_timeout_s:
                raise RuntimeError(f"async sampling produced no usable samples within sample_timeout_s="
                                   f"{cfg.sample_timeout_s} (dropped as stale: {dropped}).")
        self._arm_samplers()
        self._dropped_stale_lifetime += dropped
        self.metrics.log_value(("p3o", "learner_wait_for_data_s"), time.perf_counter() - t0, window=1)
        self.metrics.log_value(("p3o", "dropped_stale_samples"), dropped, window=1)
        self.metrics.log_value(("p3o", "dropped_stale_samples_lifetime"), self._dropped_stale_lifetime, window=1)
        return taken

    @staticmethod
    def _add_group_advantages(records: List[Dict[str, Any]]) -> None:
        rewards = torch.tensor([r["reward"] for r in records], dtype=torch.float32)
        groups = torch.tensor([r["group_id"] for r in records], dtype=torch.long)
        for r, a in zip(records, group_advantages(rewards, groups).tolist()):
            r["advantage"] = a

    def _sample_offline(self) -> Dict[str, np.ndarray]:
        from rllib_p3o.offline_data import trim_padding

        # A truthy module_state: the P3O prelearner needs no weights (RLlib would otherwise fetch them).
        mab = self.offline_data.sample(num_samples=self._num_offline_rows(), num_shards=0,
                                       module_state={"unused": True})
        sb = mab.policy_batches[DEFAULT_MODULE_ID]
        return trim_padding({k: np.asarray(sb[k]) for k in batching.COLUMNS})

    def _learn(self, batch: Dict[str, np.ndarray]) -> List[float]:
        cfg = self.config
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            update_kwargs = dict(num_epochs=cfg.num_epochs, shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch)
            if cfg.minibatch_size:  # passing None explicitly breaks multi-learner sharding in RLlib 2.60
                update_kwargs["minibatch_size"] = cfg.minibatch_size
            learner_results = self.learner_group.update(
                batch=batching.to_multi_agent_batch(batch),
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._rows_trained},
                **update_kwargs,
            )
        self._rows_trained += len(batch["input_ids"])
        per_learner_ess = [float(r[DEFAULT_MODULE_ID]["ess"].peek()) for r in learner_results
                           if DEFAULT_MODULE_ID in r and "ess" in r[DEFAULT_MODULE_ID]]
        self._log_by_source(learner_results)
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return per_learner_ess

    def _log_by_source(self, learner_results) -> None:
        """Move the learners' per-source diagnostics to ``p3o/by_source/<name>/...`` (mean over learners)."""
        from rllib_p3o.offline import source_id

        names = {source_id(n): n for n in self._source_names}
        collected: Dict[tuple, List[float]] = {}
        for r in learner_results:
            by_source = r.get(DEFAULT_MODULE_ID, {}).pop("by_source", {})
            for sid, stats in by_source.items():
                for metric, stat in stats.items():
                    collected.setdefault((names.get(int(sid), f"source_{sid}"), metric), []).append(
                        float(stat.peek()))
        for (name, metric), values in collected.items():
            self.metrics.log_value(("p3o", "by_source", name, metric), float(np.mean(values)), window=1)

    def _log_records_by_source(self, records) -> None:
        from rllib_p3o.offline import source_id

        names = {source_id(n): n for n in self._source_names}
        by: Dict[int, List[Dict[str, Any]]] = {}
        for r in records:
            by.setdefault(r["source_id"], []).append(r)
        for sid, rs in by.items():
            name = names.get(sid, f"source_{sid}")
            self.metrics.log_value(("p3o", "by_source", name, "reward_mean"),
                                   float(np.mean([r["reward"] for r in rs])), window=1)
            self.metrics.log_value(("p3o", "by_source", name, "completion_len_mean"),
                                   float(np.mean([len(r["completion_ids"]) for r in rs])), window=1)
            self.metrics.log_value(("p3o", "by_source", name, "num_completions"), len(rs), window=1)

    def _log_step(self, records, batch, timings, sync_stats, per_learner_ess) -> None:
        n_gen = int(sum(len(r["completion_ids"]) for r in records))
        n_trained = int(batch["completion_mask"].sum())
        step = {
            "num_completions": len(records),
            "num_offline_rows": self._num_offline_rows(),
            "generated_tokens": n_gen,
            "trained_tokens": n_trained,
            "trained_tokens_per_s": n_trained / max(timings["time_train_s"], 1e-9),
            "weights_seq_no": self._weights_seq_no,
            # The loss all-reduces its statistics: every learner must have used the same ESS (0 spread).
            "ess_spread_across_learners": (max(per_learner_ess) - min(per_learner_ess)) if per_learner_ess else 0.0,
            **timings,
            **{f"sync_{k}": v for k, v in sync_stats.items()},
        }
        if records:
            rewards = np.asarray([r["reward"] for r in records], dtype=np.float64)
            groups = np.asarray([r["group_id"] for r in records], dtype=np.int64)
            step.update(reward_mean=float(rewards.mean()), completion_len_mean=n_gen / len(records),
                        groups_without_signal=groups_without_signal(torch.from_numpy(rewards),
                                                                    torch.from_numpy(groups)),
                        generated_tokens_per_s=n_gen / max(timings["time_generate_s"], 1e-9))
            stale = [r["staleness"] for r in records if r.get("staleness", -1) >= 0]
            if stale:
                step.update(staleness_mean=float(np.mean(stale)), staleness_max=int(np.max(stale)))
            self._log_records_by_source(records)
        if self.offline_data is not None:
            step["offline_rows_skipped"] = getattr(self.offline_data, "rows_skipped", 0)
        for k, v in step.items():
            self.metrics.log_value(("p3o", k), v, window=1)

    def evaluate_heldout(self) -> Optional[Dict[str, float]]:
        """Greedy completions of the current policy on ``env_config["eval_dataset"]``, scored by the reward function."""
        if not self._has_engine:
            return None
        return self._sampling_runner_call("evaluate_heldout", self.config.eval_max_prompts)

    def _log_heldout(self) -> None:
        res = self.evaluate_heldout()
        if res is not None:
            for k, v in res.items():
                self.metrics.log_value(("p3o", f"heldout_{k}"), v, window=1)

    def stop(self) -> None:
        if self.offline_data is not None:
            self.offline_data.batch_iterators = None  # release the Ray Data iterator before Ray goes away
        super().stop()

    def restore_from_path(self, path, *args, **kwargs):
        super().restore_from_path(path, *args, **kwargs)
        # RLlib's own post-restore sync is fire-and-forget; push (and verify) the restored weights before going on.
        self._weights_seq_no = max(self._weights_seq_no, int(self.iteration or 0) + 1)
        self._sync_weights(blocking=True)

    # -- export ------------------------------------------------------------------------------------------------

    def export_hf(self, path: str) -> str:
        """Write the current policy as a Hugging Face model directory (weights + config + tokenizer)."""
        results = self.learner_group.foreach_learner(
            lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().save_pretrained(path))
        return [r.get() for r in results][0]
