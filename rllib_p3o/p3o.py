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

What the default loss (``loss="p3o"``) does on each kind of row: fresh rows of the policy (on-policy, a batch's first
optimizer step) get the paper's ``-sg(min(r, ESS))·logπθ·A + (1 - ESS)·KL(πθ ‖ π_b)``; the policy's own lagging rows
(stale async data, later optimizer steps on a batch, offline data) get the same with a trust region from the ESS
(``trust_region="ess_clip"``) and, per policy version, an ESS of their own (``ess_scope="version"``); a second model's
rows keep their importance ratio, truncated at 1/ESS of their own ESS where the minibatch holds only such rows (a
recording trained alone) and capped at their ESS beside the policy's own (``other_model_weight="inverse_ess_cap_alone"``),
and are pulled toward π_old, never toward that model (``kl_anchor="auto"``). The paper's
reference implementation is ``loss="p3o_reference"`` (`rllib_p3o.core.losses.p3o`).

Faults and resume: the data position (each batch source's, and the batch RNG) is part of the checkpoint, so a restored run samples what the uninterrupted one would; runners RLlib restarts get the
current, verified weights in `restore_env_runners` before they sample (docs: "Fault tolerance and resume").
"""

from __future__ import annotations

import functools
import inspect
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
from ray.rllib.utils.metrics import (
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)
from ray.util.debug import log_once
from typing_extensions import Self

from rllib_p3o.core import cpu_threads, metrics, quiet
from rllib_p3o.core.columns import Columns
from rllib_p3o.core.config_error import ConfigError, UnknownSettingError, unknown_keyword_message
from rllib_p3o.core.losses import get_loss
from rllib_p3o.core.precision import RolloutWeights, compute_dtype, param_dtype
from rllib_p3o.core.settings import BY_KEYWORD, GROUPS, SETTINGS
from rllib_p3o.core.sources import SourceNames, behavior_source_name
from rllib_p3o.data import batching
from rllib_p3o.data.datasets import materialize_datasets
from rllib_p3o.data.offline_data import P3OOfflineData, P3OOfflinePreLearner
from rllib_p3o.data.prompt_schedule import SEED_STRIDE, PromptSchedule
from rllib_p3o.data.provenance import recording_writers
from rllib_p3o.data.recorder import TrajectoryRecorder
from rllib_p3o.driver import checkpoints, learner_health, validation
from rllib_p3o.driver.batch_sources import BatchSource, OfflineSource, OnlineSource
from rllib_p3o.driver.export import export_from_learners
from rllib_p3o.driver.preflight import (
    DATASET_KEYS,
    check_cluster_fits,
    resolved_env_config,
    resolved_offline_input,
    resolved_path,
    world_problems,
)
from rllib_p3o.driver.run_state import P3O_STATE, RunState
from rllib_p3o.driver.runner_calls import EngineRunners
from rllib_p3o.driver.sampler import Sampler
from rllib_p3o.driver.step_log import StepLog
from rllib_p3o.driver.training_signature import TrainingSignature
from rllib_p3o.driver.trial_reuse import reset_trial
from rllib_p3o.driver.weight_sync import WeightSync
from rllib_p3o.learner.p3o_torch_learner import NonFiniteStepError, P3OTorchLearner
from rllib_p3o.learner.rl_module import HFCausalLMRLModule
from rllib_p3o.reward_models.actors import RewardModelActors
from rllib_p3o.runner.env import TextEnv
from rllib_p3o.runner.env_runner import VLLMEnvRunner
from rllib_p3o.sync.payload import default_tolerance
from rllib_p3o.sync.probe import PolicyDivergedError

__all__ = ["P3O", "P3OConfig"]

logger = logging.getLogger(__name__)

# P3O exists only on RLlib's new API stack: RLlib's notice that the new stack is now the default (a warning in every
# process that validates a config, keyed by the algorithm class's name) is spent here, once, so that it never prints.
log_once("P3O_on_new_api_stack")


class P3OConfig(TrainingSignature, AlgorithmConfig):
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

    def _set_training(self, settings: Dict[str, Any], kwargs: Dict[str, Any]) -> Self:
        """``training``'s work (its signature: `TrainingSignature`): P3O's settings given, their paths resolved as
        each is declared (`rllib_p3o.driver.preflight.resolved_path`); the rest to RLlib's ``training``."""
        model = settings.get("model", NotProvided)
        if model is not NotProvided and not isinstance(model, (str, os.PathLike)) and model is not None:
            kwargs["model"] = settings.pop("model")  # RLlib's own (old-stack) model dict
        unknown = sorted(set(kwargs) - _rllib_training_keywords())
        if unknown:  # before RLlib's TypeError, which names the keyword without the ones it is near
            raise UnknownSettingError(unknown_keyword_message("training", unknown[0], _training_keywords()))
        AlgorithmConfig.training(self, **kwargs)  # RLlib's own (TrainingSignature is first in the MRO)
        for key, value in settings.items():
            if value is NotProvided:
                continue
            setting = BY_KEYWORD[key]
            setattr(self, setting.name, resolved_path(setting.path, value) if setting.path else value)
        return self

    def environment(
        self, env: Any = NotProvided, *, env_config: Optional[Dict[str, Any]] = NotProvided, **kwargs
    ) -> Self:
        """RLlib's ``environment``. In ``env_config`` (``dataset``, ``eval_dataset``), relative paths are made absolute
        here, where the script runs (Tune reads them in each trial's own directory), and a Hugging Face or Ray Data
        dataset is read into rows, on the driver (`rllib_p3o.data.datasets.materialize_dataset`)."""
        if isinstance(env_config, dict):
            env_config = resolved_env_config(env_config)
        super().environment(env, env_config=env_config, **kwargs)
        self._materialize_datasets()
        return self

    def _materialize_datasets(self) -> None:
        env_config = materialize_datasets(self.env_config or {}, DATASET_KEYS)
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
        """The learner's precision: ``precision``, "fp32" when None."""
        return self.precision or "fp32"

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
        """Torch threads of each learner (`rllib_p3o.core.cpu_threads.learner_threads`)."""
        return cpu_threads.learner_threads(self)

    @property
    def env_runner_threads(self) -> int:
        """Torch/OpenMP threads of each runner's engine (`rllib_p3o.core.cpu_threads.env_runner_threads`)."""
        return cpu_threads.env_runner_threads(self)

    def validate(self) -> None:
        """RLlib's validation, then P3O's settings group by group (`rllib_p3o.core.settings.GROUPS`): each setting
        against its declaration and the group's rules (`rllib_p3o.driver.validation`); the world last (files, models,
        tokenizers, datasets: `rllib_p3o.driver.preflight.world_problems`), after the settings themselves."""
        super().validate()
        for group in GROUPS:
            for problem in validation.problems(self, group):
                self._value_error(problem)
        for problem in world_problems(self, default_env=TextEnv):
            self._value_error(problem)

    def _value_error(self, errmsg: str) -> None:
        """RLlib's, without the line it appends (how to switch all validation off): a P3O error says what to fix
        instead, and switching validation off would only move the failure into a runner."""
        if self._validate_config:
            raise ConfigError(errmsg)  # shown as one line when it ends a script (`driver.one_line_errors`)
        logger.warning(errmsg)

    def offline_data(self, **kwargs: Any) -> Self:
        """RLlib's `offline_data`, with ``input_`` resolved where the script runs
        (`rllib_p3o.driver.preflight.resolved_offline_input`)."""
        super().offline_data(**kwargs)
        self.input_ = resolved_offline_input(self.input_)
        return self

    def loss_settings(self) -> Any:
        """The settings dataclass of ``loss``: ``loss_config`` over the loss's defaults. ValueError on a bad
        setting."""
        return get_loss(self.loss).make_settings(self.loss_config or {})

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
            "fused_head": self.fused_head,
            "compute_entropy": self.entropy_coeff > 0,
            "lora": self.lora,
        }

    def get_default_learner_class(self) -> Union[Type[Learner], str]:
        return P3OTorchLearner

    @property
    def _model_config_auto_includes(self) -> Dict[str, Any]:
        # Users can still override any key through `.rl_module(model_config=...)`.
        return super()._model_config_auto_includes | self.lm_model_config()


# RLlib's learning-rate figure of the default optimizer, under learners/<module>/.
LEARNING_RATE = "default_optimizer_learning_rate"


@functools.lru_cache(maxsize=None)
def _rllib_training_keywords() -> frozenset:
    """The keywords RLlib's own ``AlgorithmConfig.training`` takes."""
    return frozenset(inspect.signature(AlgorithmConfig.training).parameters) - {"self"}


def _training_keywords() -> frozenset:
    """Every keyword ``P3OConfig.training`` takes: P3O's settings and RLlib's."""
    return frozenset(BY_KEYWORD) | _rllib_training_keywords()


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
        # Reward-model actors before the runners, which are given their names (`RewardModelActors.start_for`).
        self._reward_models = RewardModelActors.start_for(self.config)
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

    def _setup_training_state(self, actor_reused: bool, t0: float) -> None:
        """Everything a trial starts from, beside the runners: data position, counters, recorder, weight sync (the
        runners get the learner's initial weights, verified). Shared by `setup` and `reset_config`."""
        config: P3OConfig = self.config
        # Tune's `Trainable.reset` replaces ``self.config`` with the next trial's dict before `reset_config` runs.
        self._config_in_use = config
        learner_health.shut_down_at_exit(self.learner_group)  # a script that never calls stop() still ends
        runners = self._runners
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
        self._first_result_after_restore = False
        self._recorder = (
            TrajectoryRecorder(config.record_rollouts, recording_writers(config.policy_model, config.behavior_models))
            if config.record_rollouts
            else None
        )
        self._sources = self.batch_sources()
        self._run = RunState(config.seed, self._sources)
        self._source_names = SourceNames(
            [
                *map(behavior_source_name, config.behavior_models),
                *(name for source in self._sources for name in source.source_names),
            ]
        )
        under_tune = getattr(getattr(self, "_storage", None), "trial_dir_name", None) is not None
        self._step_log = StepLog(self.metrics, self._source_names, under_tune=under_tune)
        self._weight_sync.push_verified()
        # Reported with the first result: what this trial's start cost, and whether Tune reused the actor for it.
        self._step_log.log({metrics.SETUP_S: time.perf_counter() - t0, metrics.ACTOR_REUSED: float(actor_reused)})

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
        the EnvRunners and their engines (the slow part of a start), with a new learner, data position and metrics;
        False where a setting beyond `RESETTABLE_KEYS` differs (`rllib_p3o.driver.trial_reuse.reset_trial`)."""
        return reset_trial(self, new_config)

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
        self._step_log.log_step(self, records, batch, timings, sync_stats, per_learner_ess)

    def _sample_batch(self, timings: Dict[str, float]) -> Tuple[List[Dict[str, Any]], batching.Batch]:
        """This iteration's training batch, from every batch source, shuffled (learner shards are contiguous slices);
        and the completion records behind it, where the sources have them (for metrics)."""
        cfg = self.config
        parts = [source.sample(int(self.iteration or 0), timings) for source in self._sources]
        records = [record for part in parts for record in part.records]
        batch = batching.concat_padded([part.batch for part in parts], pad_id=self._pad_id)
        batch = batching.shuffle_rows(batch, self._run.rng)
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
                    timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._run.rows_trained},
                    **update_kwargs,
                )
            except Exception as error:
                dead = learner_health.dead_learners(self.learner_group)
                if not dead:
                    raise
                iteration = int(self.iteration or 0) + 1
                learner_health.stop_learners(self.learner_group)  # the group is broken: let nothing wait on it
                raise learner_health.learner_died_error(dead, cfg.num_learners, iteration) from error
        self._run.rows_trained += len(batch[Columns.INPUT_IDS])
        per_learner_ess = metrics.learner_values(learner_results, metrics.ESS)
        # Every learner skips the same steps (they see the same all-reduced gradient).
        skipped = metrics.learner_values(learner_results, metrics.SKIPPED_NONFINITE_STEPS)
        self._run.skipped_nonfinite += int(max(skipped, default=0))
        self._step_log.log_by_source(metrics.learners_by_source(learner_results, self._source_names))
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return per_learner_ess

    # -- metrics ---------------------------------------------------------------------------------------------------

    def _completions_dir(self) -> Tuple[str, Any]:
        """Under Tune: the trial's directory in the experiment's storage (the working directory's files reach it only
        with SyncConfig(sync_artifacts=True)); else this algorithm's logdir."""
        trial_storage = getattr(self, "_storage", None)
        if trial_storage is not None:
            return trial_storage.trial_fs_path, trial_storage.storage_filesystem
        return self.logdir, None

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
            self._step_log.log({metrics.HELDOUT_PREFIX + k: v for k, v in res.items()})
            self._run.heldout_reward = float(res.get(metrics.REWARD_MEAN, float("nan")))

    # -- results: the summary first, the same columns in every result -----------------------------------------------

    def train(self) -> Dict[str, Any]:
        """RLlib's (Tune's) ``train``, refusing to start a trial over silently, with `metrics.ResultColumns`'s
        columns."""
        if not self.iteration:
            checkpoints.refuse_silent_restart(getattr(self, "_storage", None))
        result = super().train()
        only_known, self._first_result_after_restore = self._first_result_after_restore, False
        return self._run.result_columns.apply(result, only_known=only_known)

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
            value = self._run.heldout_reward if key == metrics.HELDOUT_REWARD else metrics.lookup(result, *path)
            summary[key] = float(value) if value is not None else float("nan")
        return {**summary, **result}

    def _divergence_message(self, error: Exception) -> str:
        lr = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, LEARNING_RATE), default=None)
        if lr is None or not np.isfinite(lr):
            lr = self.config.lr
        return learner_health.divergence_message(int(self.iteration or 0) + 1, lr, error)

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
            for source in self._sources:
                source.runners_restarted(restored)
            stats = self._weight_sync.push_to(restored)
            logger.warning(
                "EnvRunner %s restarted; current weights v%d loaded and verified (probe max |diff| %s).",
                ", ".join(map(str, restored)),
                self._weight_sync.weights_seq_no,
                stats.get(metrics.PROBE_MAX_ABS_DIFF, "n/a"),
            )
        return restored

    # -- checkpoint state: the run's own (`rllib_p3o.driver.run_state`) besides RLlib's --------------------------

    def get_state(self, *args, **kwargs) -> Dict[str, Any]:
        if getattr(self, "_weight_sync", None) is not None:  # the learner's state is read next
            self._weight_sync.settle()
        state = super().get_state(*args, **kwargs)
        if getattr(self, "_run", None) is not None:
            state[P3O_STATE] = self._run.get_state(int(self.iteration or 0))
        return state

    def set_state(self, state: Dict[str, Any]) -> None:
        super().set_state(state)
        if state.get(P3O_STATE):
            self._run.set_state(state[P3O_STATE])

    def save_to_path(self, path=None, *args, **kwargs) -> str:
        """RLlib's checkpoint, then its manifest, written last (`rllib_p3o.driver.checkpoints`): a checkpoint cut
        short by a crash or a full disk is recognised as such when it is restored."""
        path = super().save_to_path(path, *args, **kwargs)
        if checkpoints.is_local_dir(path, kwargs.get("filesystem")):
            checkpoints.write_manifest(path)
        return path

    def restore_from_path(self, path, *args, **kwargs):
        """RLlib's restore of a checkpoint verified against its manifest. A damaged one (a file missing, truncated
        or changed; or, without a manifest, one that fails to load) is named with its file; when it is one of a
        Tune trial's, the newest intact checkpoint before it is restored instead, with a warning."""
        path = str(path) if isinstance(path, os.PathLike) else path
        self._run.checkpoint_iteration = None
        restored = checkpoints.restore_intact(
            path, lambda p: super(P3O, self).restore_from_path(p, *args, **kwargs), kwargs.get("filesystem")
        )
        if restored != path and self._run.checkpoint_iteration is not None:
            self._iteration = self._run.checkpoint_iteration  # Tune set the damaged checkpoint's iteration first
        self._first_result_after_restore = True
        self._weight_sync.push_restored(int(self.iteration or 0))
        if self._recorder is not None:  # iterations after the checkpoint are recorded again, not twice
            self._recorder.forget_after(int(self.iteration or 0))

    def export_hf(self, path: str, merged: bool = False) -> str:
        """Write the current policy as a Hugging Face model directory (weights + config + tokenizer). Under LoRA: the
        adapter in peft format (load it with ``peft.PeftModel.from_pretrained(base, path)``), or with ``merged`` a
        full model with the adapter merged in. Returns ``path``.

        ``path`` is a directory on the driver's node or a URI (``s3://...``, `rllib_p3o.core.storage`). As RLlib
        saves a checkpoint, the first learner writes the model into a temporary directory on its own node, which is
        brought to the driver's node through Ray when that is another node, and copied to ``path`` from there."""
        self._weight_sync.settle()
        return export_from_learners(self.learner_group, path, merged=merged)
