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

This module holds the config (`P3OConfig`: every setting and its validation) and the algorithm (`P3O`), as RLlib's
own algorithm packages do.

One ``training_step``: sample → update → sync → metrics.
- sample: each batch source (`P3O.batch_sources`, `rllib_p3o.driver.batch_sources`) gives its rows of the step: online
  rollouts (the vLLM EnvRunners generate ``group_size`` completions per prompt, `rllib_p3o.driver.sampler`, with
  group-normalized advantages computed before the batch is sharded over learners) and offline trajectory Parquet
  (`rllib_p3o.data.offline_data`); one padded, shuffled token batch (`rllib_p3o.data.batching`);
- update: ``learner_group.update`` (``num_epochs`` × minibatches of ``minibatch_size`` rows per learner; the loss
  is `rllib_p3o.learner.p3o_torch_learner`'s);
- sync: the new weights are loaded into every runner's engine in place and checked (`rllib_p3o.driver.weight_sync`);
- metrics (`rllib_p3o.core.metrics`).

ESS scope: the objective's ESS is computed over one optimizer step's minibatch across all learners. With the
default (no ``minibatch_size``, one epoch) that is the whole training batch of the iteration.

Faults and resume: the data position (each batch source's, and the batch RNG) is part of the checkpoint, so a restored run samples what the uninterrupted one would; runners RLlib restarts get the
current, verified weights in `restore_env_runners` before they sample (docs: "Fault tolerance and resume").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import numpy as np
import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.utils.debug.deterministic import update_global_seed_if_necessary
from ray.rllib.utils.metrics import (
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.util.debug import log_once
from typing_extensions import Self

from rllib_p3o.core import lora as lora_specs
from rllib_p3o.core import metrics, quiet, storage
from rllib_p3o.core.columns import Columns, Record
from rllib_p3o.core.deprecation import warn_once
from rllib_p3o.core.env_config import unknown_key_problem
from rllib_p3o.core.losses import LOSSES, get_loss
from rllib_p3o.core.precision import MODEL_DTYPE_PRECISION, RolloutWeights, compute_dtype, param_dtype
from rllib_p3o.core.settings import BY_KEYWORD, GROUPS, RENAMED, SETTINGS, in_group
from rllib_p3o.core.sources import SourceNames, behavior_sample_counts, behavior_source_name, check_same_tokenizer
from rllib_p3o.data import batching, prompt_fit
from rllib_p3o.data.chat import ChatTemplateError
from rllib_p3o.data.completion_samples import write_samples
from rllib_p3o.data.datasets import DatasetError, check_chat_dataset, materialize_dataset
from rllib_p3o.data.offline_data import BATCHES_TAKEN as OFFLINE_BATCHES_TAKEN
from rllib_p3o.data.offline_data import P3OOfflineData, P3OOfflinePreLearner
from rllib_p3o.data.prompt_schedule import SEED_STRIDE, PromptSchedule
from rllib_p3o.data.recorder import TrajectoryRecorder
from rllib_p3o.data.reward_models import ACTORS_KEY as REWARD_MODEL_ACTORS
from rllib_p3o.data.reward_models import reward_model_specs
from rllib_p3o.data.rewards import make_reward_function
from rllib_p3o.driver import checkpoints, learner_health
from rllib_p3o.driver.batch_sources import BatchSource, OfflineSource, OnlineSource
from rllib_p3o.driver.preflight import (
    ModelPathError,
    absolute_data_path,
    absolute_if_local,
    absolute_paths,
    check_cluster_fits,
    check_model_path,
    missing_path_problem,
)
from rllib_p3o.driver.progress import unscored_warning
from rllib_p3o.driver.reward_models import RewardModelActors
from rllib_p3o.driver.runner_calls import EngineRunners
from rllib_p3o.driver.sampler import Sampler
from rllib_p3o.driver.trial_reuse import RESETTABLE_KEYS, config_differences
from rllib_p3o.driver.weight_sync import WeightSync
from rllib_p3o.learner.compute import validate_options as validate_module_options
from rllib_p3o.learner.p3o_torch_learner import NonFiniteStepError, P3OTorchLearner
from rllib_p3o.learner.rl_module import HFCausalLMRLModule
from rllib_p3o.runner.env import TextEnv
from rllib_p3o.runner.env_runner import VLLMEnvRunner
from rllib_p3o.sync.payload import default_tolerance
from rllib_p3o.sync.probe import PolicyDivergedError

__all__ = ["P3O", "P3OConfig"]

logger = logging.getLogger(__name__)

# env_config keys that may name files (`rllib_p3o.data.datasets`).
DATASET_KEYS = ("dataset", "eval_dataset")
# Loss settings that were top-level config keys before `loss_config`.
LEGACY_LOSS_KEYS = ("clip_low", "clip_high")

# P3O exists only on RLlib's new API stack: RLlib's notice that the new stack is now the default (a warning in every
# process that validates a config, keyed by the algorithm class's name) is spent here, once, so that it never prints.
log_once("P3O_on_new_api_stack")


class P3OConfig(AlgorithmConfig):
    """Configuration of the P3O algorithm (and of its GRPO/PPO-clip baseline, ``loss="grpo"``)."""

    def __init__(self, algo_class: Optional[Type[Algorithm]] = None):
        super().__init__(algo_class=algo_class or P3O)
        # P3O's own settings, each declared once (type, default, help, group) in `rllib_p3o.core.settings`.
        for setting in SETTINGS:
            setattr(self, setting.name, setting.default())
        self.input_read_method = "read_parquet"
        self.offline_data_class = P3OOfflineData
        self.prelearner_class = P3OOfflinePreLearner
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
        # RLlib's own loggers: errors only (RLlib's default "WARN" shows its notices about its own internals), unless
        # RLLIB_P3O_VERBOSE (`rllib_p3o.core.quiet`). ``.debugging(log_level="WARN")`` brings them back.
        self.log_level = "WARN" if quiet.verbose() else "ERROR"

    def training(self, **kwargs: Any) -> Self:
        """Sets the training options: P3O's own (each declared once in `rllib_p3o.core.settings.P3OSettings`, listed
        with their types, defaults and meaning in the configuration reference) and RLlib's (``lr``, ``grad_clip``,
        ``num_epochs``, ``minibatch_size``, ...). An unknown key raises TypeError, as RLlib's ``training`` does.

        Renamed keys (``clip_low``/``clip_high``, ``model_dtype``) still work and warn once with the new name.
        """
        ours = {key: kwargs.pop(key) for key in list(kwargs) if key in BY_KEYWORD}
        ours = {key: value for key, value in ours.items() if value is not NotProvided}
        model = ours.pop("model", NotProvided)
        # Relative paths are resolved here, where the script runs: Tune runs each trial in a directory of its own.
        if isinstance(model, (str, os.PathLike)):
            self.policy_model = absolute_if_local(os.fspath(model))
        elif model is not NotProvided:
            kwargs["model"] = model  # RLlib's own (old-stack) model dict
        if isinstance(ours.get("behavior_models"), list):
            ours["behavior_models"] = [
                {**spec, "model": absolute_if_local(spec["model"])}
                if isinstance(spec, dict) and "model" in spec
                else spec
                for spec in ours["behavior_models"]
            ]
        if isinstance(ours.get("offline_rescore_model"), (str, os.PathLike)):
            ours["offline_rescore_model"] = absolute_if_local(os.fspath(ours["offline_rescore_model"]))
        record = ours.get("record_rollouts")
        if isinstance(record, (str, os.PathLike)) and not storage.is_uri(record):
            ours["record_rollouts"] = os.path.abspath(record)  # an output directory: never inside a trial's directory
        super().training(**kwargs)
        for key, value in ours.items():
            if key in RENAMED:
                warn_once(f"P3OConfig.training({key}=...)", RENAMED[key])
            setattr(self, BY_KEYWORD[key].name, value)
        return self

    def environment(
        self, env: Any = NotProvided, *, env_config: Optional[Dict[str, Any]] = NotProvided, **kwargs
    ) -> Self:
        """RLlib's ``environment``. In ``env_config`` (``dataset``, ``eval_dataset``), relative paths are made absolute
        here, where the script runs (Tune reads them in each trial's own directory), and a Hugging Face or Ray Data
        dataset is read into rows, on the driver (`rllib_p3o.data.datasets.materialize_dataset`)."""
        if isinstance(env_config, dict):
            env_config = absolute_paths(env_config, DATASET_KEYS)
            models = env_config.get("reward_models")
            if isinstance(models, (list, tuple, dict)):
                env_config["reward_models"] = [
                    {**m, "model": absolute_if_local(m["model"])} if isinstance(m, dict) and "model" in m else m
                    for m in ([models] if isinstance(models, dict) else models)
                ]
        super().environment(env, env_config=env_config, **kwargs)
        self._materialize_datasets()
        return self

    def _materialize_datasets(self) -> None:
        env_config = self.env_config or {}
        for key in DATASET_KEYS:
            value = env_config.get(key)
            if value is not None and not isinstance(value, (list, tuple, os.PathLike)):
                rows = materialize_dataset(value, key)
                if rows is not value:
                    env_config = {**env_config, key: rows}
        if env_config is not self.env_config and env_config:
            self.env_config = env_config

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
    def resolved_precision(self) -> str:
        """The learner's precision: ``precision``, else the one ``model_dtype`` names."""
        return self.precision or MODEL_DTYPE_PRECISION.get(self.model_dtype, "fp32")

    @property
    def rollout_weights(self) -> RolloutWeights:
        """How the engines hold the policy's weights: dtype and FP8 (`rllib_p3o.core.precision`)."""
        return RolloutWeights(
            dtype=self.rollout_dtype or compute_dtype(self.resolved_precision),
            fp8_simulated=self.rollout_quantization == "fp8_simulated",
            fp8_in_engine=self.rollout_quantization == "fp8",
        )

    @property
    def resolved_weight_sync_tolerance(self) -> float:
        """``weight_sync_tolerance``, else the default for the engines' precision."""
        if self.weight_sync_tolerance is not None:
            return float(self.weight_sync_tolerance)
        return default_tolerance(self.rollout_weights)[0]

    @property
    def resolved_weight_sync_rtol(self) -> float:
        """``weight_sync_rtol``, else the default for the engines' precision."""
        if self.weight_sync_rtol is not None:
            return float(self.weight_sync_rtol)
        return default_tolerance(self.rollout_weights)[1]

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
        borrowed = (
            int(self.num_cpus_for_main_process) // self.num_env_runners
            if not self.async_sampling and self.num_learners == 0 and self.num_env_runners > 0
            else 0
        )
        return int(self.num_threads_per_env_runner or (max(1, int(self.num_cpus_per_env_runner)) + borrowed))

    def validate(self) -> None:
        """RLlib's validation, then P3O's settings group by group (`rllib_p3o.core.settings.GROUPS`): each setting
        against its declaration (choices, minimum), then the group's own rules (`_validate_<group>`); the world last
        (files, models, tokenizers, datasets), after the settings themselves."""
        super().validate()
        for group in GROUPS:
            for setting in in_group(group):
                problem = setting.problem(getattr(self, setting.name))
                if problem:
                    self._value_error(problem)
            getattr(self, f"_validate_{group}")()
        self._validate_world()

    def _validate_model(self) -> None:
        if not self.policy_model:
            self._value_error("P3OConfig needs a policy model: .training(model='/path/to/hf-causal-lm').")
        try:
            # The user's own keys: the merged model_config would build P3O's part from settings not yet validated.
            validate_module_options(self._model_config if isinstance(self._model_config, dict) else {})
        except ValueError as e:
            self._value_error(f"rl_module model_config: {e}")

    def _validate_losses(self) -> None:
        if self.loss not in LOSSES:
            self._value_error(f"Unknown loss {self.loss!r}; registered losses: {', '.join(sorted(LOSSES))}.")
        try:
            self.loss_settings()
        except ValueError as e:
            self._value_error(f"loss_config: {e}")
        self._check_untruncated_sampling()
        if self.minibatch_size is not None and self.minibatch_size <= 0:
            self._value_error("minibatch_size must be positive or None.")

    def _validate_sampling(self) -> None:
        for spec in self.behavior_models:
            if "model" not in spec:
                self._value_error(f"each behavior model needs a 'model' path, got {spec}.")
        behavior_samples = sum(behavior_sample_counts(self.behavior_models, self.group_size))
        if self.behavior_models and behavior_samples > self.group_size:
            self._value_error(
                f"behavior models take {behavior_samples} samples per group, more than group_size={self.group_size}."
            )
        if self.async_sampling and self.num_env_runners < 1 and not self.in_evaluation:
            self._value_error("async_sampling needs remote EnvRunners (num_env_runners >= 1).")

    def _validate_sync(self) -> None:
        pass  # the declarations say it all; the tolerances' defaults depend on the precision (`rollout_weights`)

    def _validate_evaluation(self) -> None:
        if self.eval_temperature is None:
            self._value_error("eval_temperature must be >= 0 (0: greedy), got None.")

    def _validate_offline(self) -> None:
        if not 0.0 <= self.resolved_offline_fraction <= 1.0:
            self._value_error(f"offline_fraction must be in [0, 1], got {self.offline_fraction}.")
        if self.resolved_offline_fraction > 0 and not self.is_offline:
            self._value_error("offline_fraction > 0 needs an offline dataset: .offline_data(input_=PATH).")

    def _validate_precision(self) -> None:
        implied = MODEL_DTYPE_PRECISION.get(self.model_dtype)
        if self.precision is not None and self.model_dtype != "float32" and implied != self.precision:
            self._value_error(
                f"model_dtype={self.model_dtype!r} means precision={implied!r}, but precision={self.precision!r} "
                "is set too; set precision alone."
            )
        if self.rollout_quantization and self.lora is not None:
            self._value_error(
                "rollout_quantization with LoRA is not supported: the engine's frozen base is loaded from the model "
                "directory and never synced, so its FP8 rounding could not be checked."
            )

    def _validate_resources(self) -> None:
        pass  # the thread counts' declarations say it all; the cluster's fit is `preflight.check_cluster_fits`

    def _validate_world(self) -> None:
        """What the settings name: storage URIs, datasets and reward functions, model paths, tokenizers, LoRA."""
        self._check_storage()
        problem = unknown_key_problem(self.env_config or {}, own_environment=self._has_own_environment())
        if problem:
            self._value_error(problem)
        try:
            self._materialize_datasets()
            make_reward_function(self.env_config or {})
        except (ValueError, ImportError, AttributeError) as e:
            self._value_error(f"env_config: {e}")
        try:
            check_model_path("model", self.policy_model)
            for i, spec in enumerate(self.behavior_models):
                check_model_path(f"behavior_models[{i}]['model']", spec.get("model"))
            for i, spec in enumerate(reward_model_specs(self.env_config or {})):  # (checked above)
                check_model_path(f"env_config['reward_models'][{i}]['model']", spec["model"])
            check_model_path("offline_rescore_model", self.offline_rescore_model)
        except ModelPathError as e:
            self._value_error(str(e))
        if self.behavior_models and not self.in_evaluation:
            check_same_tokenizer(self.policy_model, [s["model"] for s in self.behavior_models], self.trust_remote_code)
        if self.policy_model and not self.in_evaluation:
            try:
                check_chat_dataset(self.env_config or {}, self.policy_model, self.trust_remote_code)
            except ChatTemplateError as e:
                self._value_error(str(e))
            self._check_prompt_lengths()
        if self.lora is not None:
            try:
                spec = lora_specs.resolve(self.lora)
                self.lora = lora_specs.validate(spec, self.policy_model, self.trust_remote_code)
            except ValueError as e:
                self._value_error(f"lora: {e}")

    def _check_prompt_lengths(self) -> None:
        """Under ``overlong_prompts="error"``: the first prompt longer than the model's context minus ``max_tokens``
        named (dataset, row, length, limit) before any engine starts (`rllib_p3o.data.prompt_fit`). Datasets a
        runner's environment produces (``multi_turn_env``, a custom env) and models off this machine are left to the
        runners."""
        env_config = self.env_config or {}
        if env_config.get("multi_turn_env") or not os.path.isdir(str(self.policy_model)):
            return
        try:
            context = prompt_fit.model_context(self.policy_model, self.trust_remote_code, self.vllm_kwargs)
        except (OSError, ValueError, AttributeError):
            return  # a config without a context length: vLLM's own check stands
        if self.max_tokens >= context:
            self._value_error(
                f"max_tokens={self.max_tokens} leaves no room for a prompt in the model's context of {context} tokens "
                f"({self.policy_model}): lower max_tokens."
            )
        if self.overlong_prompts != "error":
            return
        try:
            for key in ("dataset", "eval_dataset"):
                if env_config.get(key) is not None:
                    prompt_fit.check_dataset_fits(
                        env_config[key], key, self.policy_model, self.trust_remote_code, context, self.max_tokens
                    )
        except DatasetError as e:
            self._value_error(str(e))

    def _value_error(self, errmsg: str) -> None:
        """RLlib's, without the line it appends (how to switch all validation off): a P3O error says what to fix
        instead, and switching validation off would only move the failure into a runner."""
        if self._validate_config:
            raise ValueError(errmsg)
        logger.warning(errmsg)

    def _has_own_environment(self) -> bool:
        """Whether a user's environment class (RLlib's ``env``, ``multi_turn_env``) may read ``env_config`` keys of its
        own, beside P3O's."""
        multi_turn = (self.env_config or {}).get("multi_turn_env")
        module = multi_turn.split(":")[0] if isinstance(multi_turn, str) else getattr(multi_turn, "__module__", "")
        return self.env is not TextEnv or (multi_turn is not None and not module.startswith("rllib_p3o."))

    def _check_storage(self) -> None:
        """Models load from a local directory or a hub id, never from a URI; data files go through pyarrow's
        filesystems (`rllib_p3o.core.storage`), whose URI schemes are checked here. The paths themselves are opened
        when the run starts (the recording directory is created then)."""
        models = [("model", self.policy_model), ("offline_rescore_model", self.offline_rescore_model)]
        models += [("behavior model", spec.get("model")) for spec in self.behavior_models]
        for what, path in models:
            if isinstance(path, (str, os.PathLike)) and storage.uri_scheme(path) not in ("", "file"):
                self._value_error(
                    f"{what}={os.fspath(path)!r} is a URI: vLLM and transformers load a model from a local directory "
                    "(at the same path on every node) or a Hugging Face hub id. Copy the model to each node first."
                )
        env_config = self.env_config or {}
        paths = [("record_rollouts", self.record_rollouts)]
        paths += [(f"env_config['{key}']", env_config.get(key)) for key in ("dataset", "eval_dataset")]
        if self.is_offline:
            paths += [("input_", item) for item in (self.input_ if isinstance(self.input_, list) else [self.input_])]
        for what, path in paths:
            if isinstance(path, (str, os.PathLike)):
                try:
                    storage.check_uri(path, what)
                except storage.StorageError as e:
                    self._value_error(str(e))
                # Files read later, in a trial or a runner: a missing one is named here, before Ray starts.
                problem = missing_path_problem(what, path) if what != "record_rollouts" else None
                if problem:
                    self._value_error(problem)

    def offline_data(self, **kwargs: Any) -> Self:
        """RLlib's `offline_data`; a single URI as ``input_`` is kept as a one-item list, which RLlib hands to Ray Data
        as it is (RLlib would make a single string a ``pathlib.Path``, which turns ``s3://b/k`` into ``s3:/b/k``)."""
        super().offline_data(**kwargs)
        if isinstance(self.input_, (str, os.PathLike)) and storage.is_uri(self.input_):
            self.input_ = [os.fspath(self.input_)]
        # Relative paths are resolved here, where the script runs: Ray Data would read them in the trial's directory.
        elif isinstance(self.input_, (str, os.PathLike)) and self.input_ != "sampler":  # RLlib's "no input"
            self.input_ = absolute_data_path(self.input_)
        elif isinstance(self.input_, list):
            self.input_ = [absolute_data_path(item) for item in self.input_]
        return self

    def _check_untruncated_sampling(self) -> None:
        """P3O's losses read the behavior log-probs as those of the distribution the learner's log-probs are of. With
        processed log-probs and top-p/top-k truncation the behavior log-probs are the truncated distribution's,
        renormalized; so each token records its kept set (`kept_set_cap`) and the learner renormalizes its log-prob
        over the same set (`rllib_p3o.learner.compute.kept_set_logprobs`): the ratio compares like with like. Refused:
        truncated sampling with ``kept_set_cap=0`` (fresh samples would look off-policy, ratio < 1, and pull the
        policy toward the truncated distribution), and top-k alone with a ``kept_set_cap`` below ``top_k`` (every
        kept set would overflow the record). For the policy's sampling and each behavior model's."""
        if self.logprobs_mode != "processed":
            return
        needs_exact = self.loss in LOSSES and get_loss(self.loss).needs_untruncated_sampling
        samplers = [("the policy", self.top_p, self.top_k)] + [
            (
                f"behavior model {s.get('name') or s.get('model')}",
                s.get("top_p", self.top_p),
                s.get("top_k", self.top_k),
            )
            for s in self.behavior_models
        ]
        for who, top_p, top_k in samplers:
            truncated = (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0)
            if not truncated:
                continue
            if self.kept_set_cap == 0 and needs_exact:
                self._value_error(
                    f"loss={self.loss!r} needs the learner's log-probs renormalized over the sampler's kept set, but "
                    f"{who} samples with top_p={top_p}, top_k={top_k} and kept_set_cap=0 records no kept set: the "
                    "behavior log-probs would be those of the truncated distribution, so even fresh samples would look "
                    "off-policy. Set kept_set_cap > 0, sample with top_p=1.0 and top_k=-1, or use a loss without this "
                    "requirement (e.g. 'grpo')."
                )
            full_top_k = top_k is not None and top_k > 0 and (top_p is None or top_p >= 1.0)
            if self.kept_set_cap > 0 and full_top_k and top_k > self.kept_set_cap:
                self._value_error(
                    f"{who} samples with top_k={top_k} but kept_set_cap={self.kept_set_cap}: every token's kept set "
                    f"({top_k} tokens) would be larger than recorded and left out of the loss. Set kept_set_cap >= "
                    f"{top_k} (or 0 to record none)."
                )

    def loss_settings(self) -> Any:
        """The settings dataclass of ``loss``: ``loss_config`` over the loss's defaults, with the top-level
        ``clip_low``/``clip_high`` applied first where the loss has such settings. ValueError on a bad setting."""
        spec = get_loss(self.loss)
        fields = {f.name for f in dataclasses.fields(spec.settings)}
        legacy = {
            key: getattr(self, key) for key in LEGACY_LOSS_KEYS if key in fields and getattr(self, key) is not None
        }
        return spec.make_settings({**legacy, **(self.loss_config or {})})

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=HFCausalLMRLModule, model_config=self.lm_model_config())

    def lm_model_config(self) -> Dict[str, Any]:
        """The RLModule's ``model_config`` (see `HFCausalLMRLModule`)."""
        return {
            "model": self.policy_model,
            "dtype": param_dtype(self.resolved_precision),
            "precision": self.resolved_precision,
            "rollout_dtype": self.rollout_weights.dtype,
            "rollout_fp8_simulated": self.rollout_weights.fp8_simulated,
            "trust_remote_code": self.trust_remote_code,
            "logprob_chunk_size": self.logprob_chunk_size,
            "compute_entropy": self.entropy_coeff > 0,
            "lora": self.lora,
        }

    def get_default_learner_class(self) -> Union[Type[Learner], str]:
        return P3OTorchLearner

    @property
    def _model_config_auto_includes(self) -> Dict[str, Any]:
        # Users can still override any key through `.rl_module(model_config=...)`.
        return super()._model_config_auto_includes | self.lm_model_config()


# Keys of P3O's own checkpoint state (in the algorithm's state, beside RLlib's components).
P3O_STATE = "p3o"
BATCH_RNG_STATE = "batch_rng"
ROWS_TRAINED = "rows_trained"
SKIPPED_NONFINITE = metrics.SKIPPED_NONFINITE_STEPS
RESULT_COLUMNS = "result_columns"
ITERATION = "iteration"  # the checkpoint's own iteration: set after restoring an older intact checkpoint instead
# RLlib's learning-rate figure of the default optimizer, under learners/<module>/.
LEARNING_RATE = "default_optimizer_learning_rate"
HELDOUT_REWARD = metrics.HELDOUT_REWARD


class NothingToResumeError(RuntimeError):
    """A Tune trial that has trained before is started again without a checkpoint: it would start over silently."""


class P3O(Algorithm):
    """The P3O algorithm; see the module docstring for one training step."""

    # What Tune prints of a trial's result when it completes or fails (its status table shows the same keys: they
    # are the first top-level numbers of every result).
    _progress_metrics = tuple(key for key, _ in metrics.SUMMARY)

    @classmethod
    def get_default_config(cls) -> P3OConfig:
        return P3OConfig()

    @classmethod
    def default_resource_request(cls, config):
        """RLlib's (Tune asks for it on the driver, before the trial waits for resources), refused with the numbers
        when the cluster could never meet it (`rllib_p3o.driver.preflight.check_cluster_fits`) instead of a trial that
        stays PENDING."""
        request = super().default_resource_request(config)
        if not isinstance(config, AlgorithmConfig):
            config = cls.get_default_config().update_from_dict(config)
        check_cluster_fits(config, include_main_process=True)
        return request

    def setup(self, config: P3OConfig) -> None:
        t0 = time.perf_counter()
        if ray.is_initialized() and ray.util.get_current_placement_group() is None:
            # Built directly (``config.build_algo()``), not in a Tune trial that already holds its resources: the
            # runners and learners start as actors of their own, which would wait forever for what is not there.
            check_cluster_fits(config, include_main_process=False)
        self._start_reward_models()
        try:
            super().setup(config)
        except Exception:
            if self._reward_models is not None:
                self._reward_models.stop()
            # A runner that failed to start makes RLlib fail later and elsewhere (an IndexError in get_spaces): raise
            # the runner's own error instead.
            if getattr(self, "env_runner_group", None) is not None:
                EngineRunners(self.env_runner_group).raise_start_failure(self.config.env_config)
            raise
        self._runners = runners = EngineRunners(self.env_runner_group)
        runners.raise_start_failure(self.config.env_config)  # every runner, not only the one RLlib asked for its spaces
        self._pad_id = runners.call_first(VLLMEnvRunner.pad_token_id)
        self._has_engine = bool(runners.call_first(VLLMEnvRunner.has_engine))
        self._probe_ids = (
            runners.call_first(VLLMEnvRunner.probe_token_ids)
            if config.verify_weight_sync and self._has_engine
            else None
        )
        self._runner_restarts = 0
        self._setup_training_state(actor_reused=False, t0=t0)

    def _start_reward_models(self) -> None:
        """Start ``env_config["reward_models"]``'s actors (`rllib_p3o.driver.reward_models`) before the runners, and
        give the runners their names in ``env_config``."""
        config: P3OConfig = self.config
        self._reward_models = None
        if not (config.env_config or {}).get("reward_models") or not config.is_online:
            return
        self._reward_models = RewardModelActors(config.env_config)
        frozen, config._is_frozen = config._is_frozen, False  # the algorithm's own copy of the config
        config.env_config = {**config.env_config, REWARD_MODEL_ACTORS: self._reward_models.names}
        config._is_frozen = frozen

    def _setup_training_state(self, actor_reused: bool, t0: float) -> None:
        """Everything a trial starts from, beside the runners: data position, counters, recorder, weight sync (the
        runners get the learner's initial weights, verified). Shared by `setup` and `reset_config`."""
        config: P3OConfig = self.config
        # Tune's `Trainable.reset` replaces ``self.config`` with the next trial's dict before `reset_config` runs.
        self._config_in_use = config
        runners = self._runners
        self._rng = np.random.default_rng(config.seed)
        self._rows_trained = 0
        self._weight_sync = WeightSync(
            self.learner_group,
            runners,
            probe_token_ids=self._probe_ids,
            tolerance=config.resolved_weight_sync_tolerance,
            rtol=config.resolved_weight_sync_rtol,
            rollout_weights=config.rollout_weights
            if config.rollout_weights.changes(param_dtype(config.resolved_precision))
            else None,
            push_async=config.async_sampling and runners.remote,
            timeout_s=config.weight_sync_timeout_s,
            max_staleness=config.max_staleness,
        )
        self._skipped_nonfinite = 0  # lifetime
        self._result_columns = metrics.ResultColumns()  # fixed by the trial's first result (or its checkpoint)
        self._first_result_after_restore = False
        self._heldout_reward = float("nan")  # of the latest held-out evaluation
        self._restore_metrics: Dict[str, float] = {}  # reported with the first result after a restore
        self._recorder = TrajectoryRecorder(config.record_rollouts) if config.record_rollouts else None
        self._sources = self.batch_sources()
        self._source_names = SourceNames(
            [
                *map(behavior_source_name, config.behavior_models),
                *(name for source in self._sources for name in source.source_names),
            ]
        )
        self._weight_sync.push_verified()
        # Reported with the first result: what this trial's start cost, and whether Tune reused the actor for it.
        self._log({metrics.SETUP_S: time.perf_counter() - t0, metrics.ACTOR_REUSED: float(actor_reused)})

    def batch_sources(self) -> List[BatchSource]:
        """Where each training step's rows come from (`rllib_p3o.driver.batch_sources`): online rollouts from the vLLM
        runners and offline trajectory Parquet, in the shares ``offline_fraction`` sets. Override to add a source."""
        config: P3OConfig = self.config
        sources: List[BatchSource] = []
        if config.online_rows_per_step > 0:
            schedule = PromptSchedule(self._runners.call_first(VLLMEnvRunner.num_prompts), seed=config.seed or 0)
            self._prompt_fit = self._runners.call_first(VLLMEnvRunner.prompt_fit_counts)
            sampler = Sampler(config, self._runners, self.metrics, schedule, verify=self._weight_sync.verify)
            sources.append(
                OnlineSource(sampler, lambda: self._weight_sync.weights_seq_no, self._pad_id, self._recorder)
            )
        if config.offline_rows_per_step > 0:
            sources.append(OfflineSource(self.offline_data, config.offline_rows_per_step))
        return sources

    def reset_config(self, new_config: Dict[str, Any]) -> bool:
        """Tune's actor reuse (``tune.TuneConfig(reuse_actors=True)``): start the next trial in this actor, keeping
        the EnvRunners and their engines (the slow part of a start), with a new learner, data position and metrics.

        Only `RESETTABLE_KEYS` (and keys `P3OConfig` does not define, such as a sweep's own) may differ from the
        running config; anything else needs new runners, so this returns False and Tune fails the trial with the
        message logged here (run such trials in separate experiments, or without ``reuse_actors``).
        """
        t0 = time.perf_counter()
        new = self.get_default_config().update_from_dict(new_config)
        new.validate()  # (validation also fills in settings, which the comparison needs)
        different = config_differences(self._config_in_use, new)
        if different:
            logger.error(
                "P3O.reset_config cannot reuse this actor: %s differ(s) from the running trial; only %s "
                "may change between reused trials.",
                ", ".join(different),
                ", ".join(RESETTABLE_KEYS),
            )
            return False
        if getattr(self, "_reward_models", None) is not None:  # the same reward models (compared above): kept
            new.env_config = {**new.env_config, REWARD_MODEL_ACTORS: self._reward_models.names}
        new.freeze()
        for source in self._sources:
            source.close()
        self._weight_sync.close()
        self.learner_group.shutdown()
        self.config = new
        update_global_seed_if_necessary(new.framework_str, new.seed)
        self.metrics = MetricsLogger(root=True, stats_cls_lookup=new.stats_cls_lookup)
        self._counters.clear()
        self._timers.clear()
        spaces = {INPUT_ENV_SPACES: (new.observation_space, new.action_space), **(self.spaces or {})}
        self.learner_group = new.build_learner_group(
            rl_module_spec=new.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
        )
        if hasattr(self.offline_data, "set_position"):  # the same files (compared above): read them from the start
            self.offline_data.set_position({OFFLINE_BATCHES_TAKEN: 0}, batch_rows=new.offline_rows_per_step)
        self._setup_training_state(actor_reused=True, t0=t0)
        return True

    # -- one iteration: sample -> advantages, batch -> update -> sync -> metrics ------------------------------------

    def training_step(self) -> None:
        cfg: P3OConfig = self.config
        it = int(self.iteration or 0)  # iterations done so far; this one is it + 1
        timings: Dict[str, float] = {}
        if cfg.eval_interval and (it == 0 or (it + 1) % cfg.eval_interval == 0):
            with metrics.timed(timings, metrics.TIME_EVAL_S):
                self._log_heldout()  # the policy as it is at the start of this iteration (iteration 1: untrained)
        t0 = time.perf_counter()
        records, batch = self._sample_batch(timings)
        with metrics.timed(timings, metrics.TIME_TRAIN_S):
            per_learner_ess = self._update(batch)
        with metrics.timed(timings, metrics.TIME_SYNC_S), self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            sync_stats = self._weight_sync.push()
        timings[metrics.TIME_OTHER_S] = (
            time.perf_counter() - t0 - sum(timings.values()) + timings.get(metrics.TIME_EVAL_S, 0.0)
        )
        self._log_step(records, batch, timings, sync_stats, per_learner_ess)

    def _sample_batch(self, timings: Dict[str, float]) -> Tuple[List[Dict[str, Any]], batching.Batch]:
        """This iteration's training batch, from every batch source, shuffled (learner shards are contiguous slices);
        and the completion records behind it, where the sources have them (for metrics)."""
        cfg = self.config
        parts = [source.sample(int(self.iteration or 0), timings) for source in self._sources]
        records = [record for part in parts for record in part.records]
        batch = batching.concat_padded([part.batch for part in parts], pad_id=self._pad_id)
        batch = batching.shuffle_rows(batch, self._rng)
        return records, batching.pad_rows_to_multiple(batch, max(1, cfg.num_learners) * (cfg.minibatch_size or 1))

    def _update(self, batch: batching.Batch) -> List[float]:
        """One ``learner_group.update`` on the batch; returns each learner's ESS (they must agree)."""
        cfg = self.config
        self._weight_sync.settle()  # the learner's probe of the weights last pushed is scored before they change
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            update_kwargs = dict(num_epochs=cfg.num_epochs, shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch)
            if cfg.minibatch_size:  # passing None explicitly breaks multi-learner sharding in RLlib 2.60
                update_kwargs["minibatch_size"] = cfg.minibatch_size
            try:
                learner_results = self.learner_group.update(
                    batch=batching.to_multi_agent_batch(batch),
                    timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._rows_trained},
                    **update_kwargs,
                )
            except Exception as error:
                dead = learner_health.dead_learners(self.learner_group)
                if not dead:
                    raise
                iteration = int(self.iteration or 0) + 1
                raise learner_health.learner_died_error(dead, cfg.num_learners, iteration) from error
        self._rows_trained += len(batch[Columns.INPUT_IDS])
        per_learner_ess = [
            float(r[DEFAULT_MODULE_ID][metrics.ESS].peek())
            for r in learner_results
            if DEFAULT_MODULE_ID in r and metrics.ESS in r[DEFAULT_MODULE_ID]
        ]
        # Every learner skips the same steps (they see the same all-reduced gradient).
        self._skipped_nonfinite += max(
            (
                int(r[DEFAULT_MODULE_ID][metrics.SKIPPED_NONFINITE_STEPS].peek())
                for r in learner_results
                if DEFAULT_MODULE_ID in r and metrics.SKIPPED_NONFINITE_STEPS in r[DEFAULT_MODULE_ID]
            ),
            default=0,
        )
        self._log_by_source(metrics.learners_by_source(learner_results, self._source_names))
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return per_learner_ess

    # -- metrics ---------------------------------------------------------------------------------------------------

    def _log_step(self, records, batch, timings, sync_stats, per_learner_ess) -> None:
        cfg = self.config
        skipped = getattr(self.offline_data, "rows_skipped", 0) if self.offline_data is not None else None
        self._log(
            metrics.step_metrics(
                records,
                batch,
                timings,
                sync_stats,
                per_learner_ess,
                num_offline_rows=cfg.offline_rows_per_step,
                weights_seq_no=self._weight_sync.weights_seq_no,
                offline_rows_skipped=skipped,
            )
        )
        self._log(
            {
                metrics.SKIPPED_NONFINITE_STEPS: self._skipped_nonfinite,
                metrics.ROLLOUT_FP8_SIMULATED: float(cfg.rollout_weights.fp8_simulated),
                # Every iteration, so that the key is a column from the first result on (`metrics.ResultColumns`).
                metrics.GROUPS_RESAMPLED_AFTER_RESTORE: 0.0,
                **getattr(self, "_prompt_fit", {}),
                **self._restore_metrics,
            }
        )
        self._restore_metrics = {}
        if self._runners.remote:
            self._log(
                {
                    metrics.HEALTHY_ENV_RUNNERS: len(self._runners.healthy_ids()),
                    metrics.ENV_RUNNER_RESTARTS_LIFETIME: self._runner_restarts,
                }
            )
        if records:
            self._warn_unscored(records)
            self._log_by_source(metrics.records_by_source(records, self._source_names))
            for name, mean in metrics.rewards_by_function(records).items():
                self.metrics.log_value((metrics.P3O, metrics.REWARDS, name), mean, window=1)
            if cfg.log_completions:
                # Under Tune: the trial's directory in the experiment's storage (the working directory's files
                # reach it only with SyncConfig(sync_artifacts=True)); else this algorithm's logdir.
                storage = getattr(self, "_storage", None)
                directory, fs = (storage.trial_fs_path, storage.storage_filesystem) if storage else (self.logdir, None)
                write_samples(records, directory, int(self.iteration or 0) + 1, int(cfg.log_completions), fs)

    def _warn_unscored(self, records: List[Dict[str, Any]]) -> None:
        """The first iteration with completions no reward function scored, as a warning on the driver. Under Tune the
        status table's printer says it on the user's screen (`IterationPrinter`; a trial's log may not reach it)."""
        if getattr(self, "_warned_unscored", False) or getattr(getattr(self, "_storage", None), "trial_dir_name", None):
            return
        unscored = sum(1 for record in records if record[Record.REWARD] != record[Record.REWARD])  # NaN
        if unscored:
            logger.warning(unscored_warning(int(self.iteration or 0) + 1, unscored, len(records)))
            self._warned_unscored = True

    def _log(self, step: Dict[str, float]) -> None:
        for key, value in step.items():
            self.metrics.log_value((metrics.P3O, key), value, window=1)

    def _log_by_source(self, by_source: Dict[Tuple[str, str], float]) -> None:
        for (name, key), value in by_source.items():
            self.metrics.log_value((metrics.P3O, metrics.BY_SOURCE, name, key), value, window=1)

    def evaluate_heldout(self) -> Optional[Dict[str, float]]:
        """The current policy's completions on ``env_config["eval_dataset"]`` (greedy unless ``eval_temperature`` > 0),
        scored by the reward function."""
        if not self._has_engine:
            return None
        cfg = self.config
        n, temperature, k = cfg.eval_max_prompts, cfg.eval_temperature, cfg.eval_samples_per_prompt
        # Seeded by the iteration: a rerun (or a restored run) evaluates with the same samples.
        seed = (cfg.seed or 0) * SEED_STRIDE + int(self.iteration or 0)
        result, probe = self._runners.call_first(
            lambda runner: (runner.evaluate_heldout(n, temperature, k, seed), runner.take_probe_result())
        )
        self._weight_sync.check(probe)  # the evaluation may be the first use of the weights last pushed
        return result

    def _log_heldout(self) -> None:
        res = self.evaluate_heldout()
        if res is not None:
            self._log({metrics.HELDOUT_PREFIX + k: v for k, v in res.items()})
            self._heldout_reward = float(res.get(metrics.REWARD_MEAN, float("nan")))

    # -- results: the summary first, the same columns in every result -----------------------------------------------

    def train(self) -> Dict[str, Any]:
        """RLlib's (Tune's) ``train``, refusing to start a trial over silently, with `metrics.ResultColumns`'s
        columns."""
        if not self.iteration:
            self._refuse_silent_restart()
        result = super().train()
        only_known, self._first_result_after_restore = self._first_result_after_restore, False
        return self._result_columns.apply(result, only_known=only_known)

    def step(self) -> Dict[str, Any]:
        """RLlib's ``step``, with the run's summary (`metrics.SUMMARY`) first: Tune's status table shows it. A
        diverged policy (or too many non-finite steps in a row) is reported as divergence, with the learning rate."""
        try:
            result = super().step()
        except PolicyDivergedError as e:
            raise PolicyDivergedError(self._divergence_message(e)) from None
        except NonFiniteStepError as e:
            raise NonFiniteStepError(self._divergence_message(e)) from None
        summary = {}
        for key, path in metrics.SUMMARY:
            value = self._heldout_reward if key == metrics.HELDOUT_REWARD else metrics.lookup(result, *path)
            summary[key] = float(value) if value is not None else float("nan")
        return {**summary, **result}

    def _divergence_message(self, error: Exception) -> str:
        lr = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, LEARNING_RATE), default=None)
        if lr is None or not np.isfinite(lr):
            lr = self.config.lr
        lr = f"{lr:g}" if isinstance(lr, (int, float)) else f"schedule {lr}"
        return (
            f"Training diverged in iteration {int(self.iteration or 0) + 1} at lr={lr}: {_own_message(error)} "
            "Lower the learning rate (.training(lr=...)); checkpoints written before this iteration hold the weights "
            "from before the divergence."
        )

    def _refuse_silent_restart(self) -> None:
        """Under Tune: raise `NothingToResumeError` if this trial has reported results before but starts without a
        checkpoint (``Tuner.restore(..., resume_errored=True)`` or a retry of a run without checkpoints): it would
        train from iteration 1 again, next to its earlier results. Nothing of those is touched."""
        trial_storage = getattr(self, "_storage", None)
        if trial_storage is None or getattr(trial_storage, "trial_dir_name", None) is None:
            return  # not a Tune trial
        reported, where = _reported_iterations(trial_storage)
        if reported:
            raise NothingToResumeError(
                f"Nothing to resume from: trial {trial_storage.trial_dir_name} has reported {reported} iteration(s) before "
                f"({where}) but Tune has no checkpoint of it, so it would start over from iteration 1. To resume "
                "runs, checkpoint them: tune.RunConfig(checkpoint_config=tune.CheckpointConfig(checkpoint_frequency"
                "=N, checkpoint_at_end=True)). To start this trial over, use tune.Tuner.restore(path, "
                "trainable='P3O', restart_errored=True) (it gets a new directory; this one is kept)."
            )

    # -- lifecycle, checkpoints, export ----------------------------------------------------------------------------

    def stop(self) -> None:
        if getattr(self, "_weight_sync", None) is not None:
            self._weight_sync.close()
        if self.offline_data is not None:
            self.offline_data.batch_iterators = None  # release the Ray Data iterator before Ray goes away
        super().stop()
        if getattr(self, "_reward_models", None) is not None:
            self._reward_models.stop()

    def restore_env_runners(self, env_runner_group) -> List[int]:
        """RLlib's hook after it restarted failed runners: load the current weights into their new engines and
        check the probe before they sample (RLlib's own restore only sets the runner state, without waiting)."""
        if env_runner_group is not self.env_runner_group:
            return super().restore_env_runners(env_runner_group)
        restored = env_runner_group.probe_unhealthy_env_runners() if self.config.is_online else []
        if restored:
            self._runner_restarts += len(restored)
            stats = self._weight_sync.push_to(restored)
            logger.warning(
                "EnvRunner %s restarted; current weights v%d loaded and verified (probe max |diff| %s).",
                ", ".join(map(str, restored)),
                self._weight_sync.weights_seq_no,
                stats.get(metrics.PROBE_MAX_ABS_DIFF, "n/a"),
            )
        return restored

    # -- checkpoint state: the data position besides RLlib's own (weights, optimizer, iteration, metrics) ----------

    def get_state(self, *args, **kwargs) -> Dict[str, Any]:
        if getattr(self, "_weight_sync", None) is not None:  # the learner's state is read next
            self._weight_sync.settle()
        state = super().get_state(*args, **kwargs)
        state[P3O_STATE] = {
            **{source.state_key: source.get_state() for source in getattr(self, "_sources", ())},
            BATCH_RNG_STATE: self._rng.bit_generator.state,
            ROWS_TRAINED: self._rows_trained,
            SKIPPED_NONFINITE: self._skipped_nonfinite,
            RESULT_COLUMNS: getattr(self, "_result_columns", metrics.ResultColumns()).columns,
            ITERATION: int(self.iteration or 0),
            HELDOUT_REWARD: getattr(self, "_heldout_reward", float("nan")),
        }
        return state

    def set_state(self, state: Dict[str, Any]) -> None:
        super().set_state(state)
        own = state.get(P3O_STATE)
        if not own:
            return
        for source in self._sources:
            if own.get(source.state_key) is not None:
                self._restore_metrics.update(source.set_state(own[source.state_key]))
        self._rng.bit_generator.state = own[BATCH_RNG_STATE]
        self._rows_trained = int(own[ROWS_TRAINED])
        self._skipped_nonfinite = int(own.get(SKIPPED_NONFINITE, 0))
        self._result_columns = metrics.ResultColumns(own.get(RESULT_COLUMNS))
        self._heldout_reward = float(own.get(HELDOUT_REWARD, float("nan")))
        self._checkpoint_iteration = own.get(ITERATION)

    def save_to_path(self, path=None, *args, **kwargs) -> str:
        """RLlib's checkpoint, then its manifest, written last (`rllib_p3o.driver.checkpoints`): a checkpoint cut
        short by a crash or a full disk is recognised as such when it is restored."""
        path = super().save_to_path(path, *args, **kwargs)
        if _local_dir(path, kwargs.get("filesystem")):
            checkpoints.write_manifest(path)
        return path

    def restore_from_path(self, path, *args, **kwargs):
        """RLlib's restore of a checkpoint verified against its manifest. A damaged one (a file missing, truncated
        or changed; or, without a manifest, one that fails to load) is named with its file; when it is one of a
        Tune trial's, the newest intact checkpoint before it is restored instead, with a warning."""
        path = str(path) if isinstance(path, os.PathLike) else path
        self._checkpoint_iteration = None
        restored = self._restore_intact(path, *args, **kwargs)
        if restored != path and self._checkpoint_iteration is not None:
            self._iteration = self._checkpoint_iteration  # Tune set the damaged checkpoint's iteration before loading
        self._first_result_after_restore = True
        self._weight_sync.push_restored(int(self.iteration or 0))
        if self._recorder is not None:  # iterations after the checkpoint are recorded again, not twice
            self._recorder.forget_after(int(self.iteration or 0))

    def _restore_intact(self, path: Any, *args, **kwargs) -> Any:
        """Restore ``path`` or, if it is damaged, the newest intact Tune sibling before it; returns what was restored."""
        local = _local_dir(path, kwargs.get("filesystem"))
        try:
            if local and checkpoints.has_manifest(path):
                checkpoints.verify(path)
            try:
                super().restore_from_path(path, *args, **kwargs)
                return path
            except Exception as e:
                if not local or checkpoints.has_manifest(path):
                    raise
                # No manifest (a checkpoint of an older version, or one cut short): a failed load names it.
                raise checkpoints.DamagedCheckpointError(path, f"it has no manifest and fails to load ({e!r})") from e
        except checkpoints.DamagedCheckpointError as damaged:
            fallback = checkpoints.newest_intact(path) if local else None
            if fallback is None:
                raise checkpoints.DamagedCheckpointError(
                    damaged.checkpoint,
                    f"{damaged.problem}; no intact checkpoint before it. Restore an earlier checkpoint explicitly "
                    "(P3O.from_checkpoint(path)) or start over.",
                ) from None
            logger.warning(
                "Checkpoint %s is damaged (%s): restoring %s, the newest intact checkpoint before it; the iterations "
                "after it are trained again.",
                damaged.checkpoint,
                damaged.problem,
                fallback,
            )
            super().restore_from_path(fallback, *args, **kwargs)
            return fallback

    def export_hf(self, path: str, merged: bool = False) -> str:
        """Write the current policy as a Hugging Face model directory (weights + config + tokenizer). Under LoRA: the
        adapter in peft format (load it with ``peft.PeftModel.from_pretrained(base, path)``), or with ``merged`` a
        full model with the adapter merged in. Returns ``path``.

        ``path`` is a directory on the driver's node or a URI (``s3://...``, `rllib_p3o.core.storage`). As RLlib
        saves a checkpoint, the first learner writes the model into a temporary directory on its own node, which is
        brought to the driver's node through Ray when that is another node, and copied to ``path`` from there."""
        import shutil
        import tempfile

        import ray
        from ray.tune.utils.file_transfer import sync_dir_between_nodes

        target = storage.locate(path)
        target.makedirs()  # a bad bucket or a read-only directory fails before the model is written anywhere
        self._weight_sync.settle()

        def save(learner: Learner) -> Tuple[str, str]:
            tmp = tempfile.mkdtemp(prefix="p3o-export-")
            learner.module[DEFAULT_MODULE_ID].unwrapped().save_pretrained(tmp, merged=merged)
            return ray.util.get_node_ip_address(), tmp

        first = None if self.learner_group.is_local else self.learner_group._worker_manager.healthy_actor_ids()[:1]
        learner_ip, learner_tmp = next(iter(self.learner_group.foreach_learner(save, remote_actor_ids=first))).get()
        here = learner_tmp
        if learner_ip != ray.util.get_node_ip_address():
            here = tempfile.mkdtemp(prefix="p3o-export-")
            sync_dir_between_nodes(learner_ip, learner_tmp, ray.util.get_node_ip_address(), here, max_size_bytes=None)
            self.learner_group.foreach_learner(lambda _: shutil.rmtree(learner_tmp), remote_actor_ids=first)
        try:
            storage.upload_dir(here, target)
        finally:
            shutil.rmtree(here, ignore_errors=True)
        return os.fspath(path)


def _own_message(error: Exception) -> str:
    """An error's own message: a remote learner's arrives as a Ray task error (with the remote traceback in its text)
    whose ``cause`` is the original."""
    return str(getattr(error, "cause", None) or error).strip()


def _local_dir(path: Any, filesystem: Any) -> bool:
    """Whether a checkpoint ``path`` (with RLlib's pyarrow ``filesystem``, or None) is a directory on this node."""
    local_fs = filesystem is None or getattr(filesystem, "type_name", None) == "local"
    return local_fs and isinstance(path, str) and os.path.isdir(path)


def _reported_iterations(trial_storage: Any) -> Tuple[int, str]:
    """How many results a Tune trial has reported so far (the lines of its result.json), and where: on the storage
    filesystem, or in the driver's staging copy when it is on this node (Tune syncs it to storage now and then)."""
    from ray.tune.result import EXPR_RESULT_FILE

    counts = []
    try:
        with trial_storage.storage_filesystem.open_input_stream(
            f"{trial_storage.trial_fs_path}/{EXPR_RESULT_FILE}"
        ) as f:
            counts.append((f.read().count(b"\n"), f"{trial_storage.trial_fs_path}/{EXPR_RESULT_FILE}"))
    except (FileNotFoundError, OSError):
        pass
    staged = os.path.join(trial_storage.trial_driver_staging_path, EXPR_RESULT_FILE)
    if os.path.isfile(staged):
        with open(staged, "rb") as f:
            counts.append((f.read().count(b"\n"), staged))
    return max(counts, default=(0, ""))
