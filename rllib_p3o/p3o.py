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

One ``training_step``: sample (the vLLM EnvRunners generate ``group_size`` completions for each online prompt,
`rllib_p3o.sampler`; offline rows come from `P3OOfflineData`) → group-normalized advantages over each prompt's
completions (before sharding across learners) and one padded token batch (`rllib_p3o.batching`) →
``learner_group.update`` (``num_epochs`` × minibatches of ``minibatch_size`` rows per learner) → the new weights
are loaded into every runner's engine in place (`rllib_p3o.weight_sync`) → metrics (`rllib_p3o.metrics`).

ESS scope: the objective's ESS is computed over one optimizer step's minibatch across all learners. With the
default (no ``minibatch_size``, one epoch) that is the whole training batch of the iteration.

Faults and resume: the data position (the driver's `PromptSchedule`, the batch RNG, the offline batches taken) is
part of the checkpoint, so a restored run samples what the uninterrupted one would; runners RLlib restarts get the
current, verified weights in `restore_env_runners` before they sample (README, "Fault tolerance and resume").
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.utils.debug.deterministic import update_global_seed_if_necessary
from ray.rllib.utils.metrics import (
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o import batching, metrics
from rllib_p3o.columns import Columns
from rllib_p3o.engine_runners import EngineRunners
from rllib_p3o.offline_data import BATCHES_TAKEN as OFFLINE_BATCHES_TAKEN
from rllib_p3o.p3o_config import P3OConfig
from rllib_p3o.trial_reuse import RESETTABLE_KEYS, config_differences
from rllib_p3o.prompt_schedule import PromptSchedule
from rllib_p3o.sampler import Sampler
from rllib_p3o.sources import SourceNames, behavior_source_name
from rllib_p3o.recorder import TrajectoryRecorder
from rllib_p3o.weight_sync import WeightSync

__all__ = ["P3O", "P3OConfig"]

logger = logging.getLogger(__name__)

# Keys of P3O's own checkpoint state (in the algorithm's state, beside RLlib's components).
P3O_STATE = "p3o"
SAMPLER_STATE = "sampler"
OFFLINE_STATE = "offline_position"
BATCH_RNG_STATE = "batch_rng"
ROWS_TRAINED = "rows_trained"
SKIPPED_NONFINITE = metrics.SKIPPED_NONFINITE_STEPS


class P3O(Algorithm):
    """The P3O algorithm; see the module docstring for one training step."""

    @classmethod
    def get_default_config(cls) -> P3OConfig:
        return P3OConfig()

    def setup(self, config: P3OConfig) -> None:
        t0 = time.perf_counter()
        super().setup(config)
        self._runners = runners = EngineRunners(self.env_runner_group)
        self._pad_id = runners.call_first("pad_token_id")
        self._has_engine = bool(runners.call_first("has_engine"))
        self._probe_ids = (runners.call_first("probe_token_ids")
                           if config.verify_weight_sync and self._has_engine else None)
        self._runner_restarts = 0
        self._setup_training_state(actor_reused=False, t0=t0)

    def _setup_training_state(self, actor_reused: bool, t0: float) -> None:
        """Everything a trial starts from, beside the runners: data position, counters, recorder, weight sync (the
        runners get the learner's initial weights, verified). Shared by `setup` and `reset_config`."""
        config: P3OConfig = self.config
        # Tune's `Trainable.reset` replaces ``self.config`` with the next trial's dict before `reset_config` runs.
        self._config_in_use = config
        runners = self._runners
        self._rng = np.random.default_rng(config.seed)
        self._rows_trained = 0
        self._weight_sync = WeightSync(self.learner_group, runners, probe_token_ids=self._probe_ids,
                                       tolerance=config.weight_sync_tolerance,
                                       push_async=config.async_sampling and runners.remote,
                                       timeout_s=config.weight_sync_timeout_s, max_staleness=config.max_staleness)
        self._sampler = (Sampler(config, runners, self.metrics,
                                 PromptSchedule(runners.call_first("num_prompts"), seed=config.seed or 0),
                                 verify=self._weight_sync.verify)
                         if config.online_rows_per_step > 0 else None)
        self._skipped_nonfinite = 0  # lifetime
        self._source_names = SourceNames([*map(behavior_source_name, config.behavior_models),
                                          *getattr(self.offline_data, "source_names", ())])
        self._recorder = TrajectoryRecorder(config.record_rollouts) if config.record_rollouts else None
        self._weight_sync.push_verified()
        # Reported with the first result: what this trial's start cost, and whether Tune reused the actor for it.
        self._log({metrics.SETUP_S: time.perf_counter() - t0, metrics.ACTOR_REUSED: float(actor_reused)})

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
            logger.error("P3O.reset_config cannot reuse this actor: %s differ(s) from the running trial; only %s "
                         "may change between reused trials.", ", ".join(different), ", ".join(RESETTABLE_KEYS))
            return False
        new.freeze()
        if self._sampler is not None:
            self._sampler.drain()
        self._weight_sync.close()
        self.learner_group.shutdown()
        self.config = new
        update_global_seed_if_necessary(new.framework_str, new.seed)
        self.metrics = MetricsLogger(root=True, stats_cls_lookup=new.stats_cls_lookup)
        self._counters.clear()
        self._timers.clear()
        spaces = {INPUT_ENV_SPACES: (new.observation_space, new.action_space), **(self.spaces or {})}
        self.learner_group = new.build_learner_group(
            rl_module_spec=new.get_multi_rl_module_spec(spaces=spaces, inference_only=False))
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
        with (metrics.timed(timings, metrics.TIME_SYNC_S),
              self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER))):
            sync_stats = self._weight_sync.push()
        timings[metrics.TIME_OTHER_S] = (time.perf_counter() - t0 - sum(timings.values())
                                         + timings.get(metrics.TIME_EVAL_S, 0.0))
        self._log_step(records, batch, timings, sync_stats, per_learner_ess)

    def _sample_batch(self, timings: Dict[str, float]) -> Tuple[List[Dict[str, Any]], batching.Batch]:
        """The online completion records (with advantages) and the training batch of this iteration."""
        cfg = self.config
        parts: List[batching.Batch] = []
        records: List[Dict[str, Any]] = []
        if cfg.online_rows_per_step > 0:
            with (metrics.timed(timings, metrics.TIME_GENERATE_S),
                  self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER))):
                records = self._sampler.sample(self._weight_sync.weights_seq_no)
            with metrics.timed(timings, metrics.TIME_BATCHING_S):
                batching.add_group_advantages(records)  # over whole prompt groups, before sharding
                if self._recorder is not None:
                    self._recorder.write(records, iteration=int(self.iteration or 0))
                parts.append(batching.pad_records(records, pad_id=self._pad_id))
        if cfg.offline_rows_per_step > 0:
            with metrics.timed(timings, metrics.TIME_OFFLINE_READ_S):
                parts.append(self.offline_data.sample_batch(cfg.offline_rows_per_step))
        batch = batching.concat_padded(parts, pad_id=self._pad_id)
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
            learner_results = self.learner_group.update(
                batch=batching.to_multi_agent_batch(batch),
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._rows_trained},
                **update_kwargs,
            )
        self._rows_trained += len(batch[Columns.INPUT_IDS])
        per_learner_ess = [float(r[DEFAULT_MODULE_ID][metrics.ESS].peek()) for r in learner_results
                           if DEFAULT_MODULE_ID in r and metrics.ESS in r[DEFAULT_MODULE_ID]]
        # Every learner skips the same steps (they see the same all-reduced gradient).
        self._skipped_nonfinite += max((int(r[DEFAULT_MODULE_ID][metrics.SKIPPED_NONFINITE_STEPS].peek())
                                        for r in learner_results if DEFAULT_MODULE_ID in r
                                        and metrics.SKIPPED_NONFINITE_STEPS in r[DEFAULT_MODULE_ID]), default=0)
        self._log_by_source(metrics.learners_by_source(learner_results, self._source_names))
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return per_learner_ess

    # -- metrics ---------------------------------------------------------------------------------------------------

    def _log_step(self, records, batch, timings, sync_stats, per_learner_ess) -> None:
        cfg = self.config
        skipped = getattr(self.offline_data, "rows_skipped", 0) if self.offline_data is not None else None
        self._log(metrics.step_metrics(records, batch, timings, sync_stats, per_learner_ess,
                                       num_offline_rows=cfg.offline_rows_per_step,
                                       weights_seq_no=self._weight_sync.weights_seq_no, offline_rows_skipped=skipped))
        self._log({metrics.SKIPPED_NONFINITE_STEPS: self._skipped_nonfinite})
        if self._runners.remote:
            self._log({metrics.HEALTHY_ENV_RUNNERS: len(self._runners.healthy_ids()),
                       metrics.ENV_RUNNER_RESTARTS_LIFETIME: self._runner_restarts})
        if records:
            self._log_by_source(metrics.records_by_source(records, self._source_names))

    def _log(self, step: Dict[str, float]) -> None:
        for key, value in step.items():
            self.metrics.log_value((metrics.P3O, key), value, window=1)

    def _log_by_source(self, by_source: Dict[Tuple[str, str], float]) -> None:
        for (name, key), value in by_source.items():
            self.metrics.log_value((metrics.P3O, metrics.BY_SOURCE, name, key), value, window=1)

    def evaluate_heldout(self) -> Optional[Dict[str, float]]:
        """Greedy completions of the current policy on ``env_config["eval_dataset"]``, scored by the reward function."""
        if not self._has_engine:
            return None
        n = self.config.eval_max_prompts
        result, probe = self._runners.call_first(lambda runner: (runner.evaluate_heldout(n),
                                                                 runner.take_probe_result()))
        self._weight_sync.check(probe)  # the evaluation may be the first use of the weights last pushed
        return result

    def _log_heldout(self) -> None:
        res = self.evaluate_heldout()
        if res is not None:
            self._log({metrics.HELDOUT_PREFIX + k: v for k, v in res.items()})

    # -- lifecycle, checkpoints, export ----------------------------------------------------------------------------

    def stop(self) -> None:
        if getattr(self, "_weight_sync", None) is not None:
            self._weight_sync.close()
        if self.offline_data is not None:
            self.offline_data.batch_iterators = None  # release the Ray Data iterator before Ray goes away
        super().stop()

    def restore_env_runners(self, env_runner_group) -> List[int]:
        """RLlib's hook after it restarted failed runners: load the current weights into their new engines and
        check the probe before they sample (RLlib's own restore only sets the runner state, without waiting)."""
        if env_runner_group is not self.env_runner_group:
            return super().restore_env_runners(env_runner_group)
        restored = env_runner_group.probe_unhealthy_env_runners() if self.config.is_online else []
        if restored:
            self._runner_restarts += len(restored)
            stats = self._weight_sync.push_to(restored)
            logger.warning("EnvRunner %s restarted; current weights v%d loaded and verified (probe max |diff| %s).",
                           ", ".join(map(str, restored)), self._weight_sync.weights_seq_no,
                           stats.get(metrics.PROBE_MAX_ABS_DIFF, "n/a"))
        return restored

    # -- checkpoint state: the data position besides RLlib's own (weights, optimizer, iteration, metrics) ----------

    def get_state(self, *args, **kwargs) -> Dict[str, Any]:
        if getattr(self, "_weight_sync", None) is not None:  # the learner's state is read next
            self._weight_sync.settle()
        state = super().get_state(*args, **kwargs)
        state[P3O_STATE] = {
            SAMPLER_STATE: self._sampler.get_state() if self._sampler is not None else None,
            OFFLINE_STATE: self.offline_data.get_position() if hasattr(self.offline_data, "get_position") else None,
            BATCH_RNG_STATE: self._rng.bit_generator.state,
            ROWS_TRAINED: self._rows_trained,
            SKIPPED_NONFINITE: self._skipped_nonfinite,
        }
        return state

    def set_state(self, state: Dict[str, Any]) -> None:
        super().set_state(state)
        own = state.get(P3O_STATE)
        if not own:
            return
        if self._sampler is not None and own.get(SAMPLER_STATE):
            resampled = self._sampler.set_state(own[SAMPLER_STATE])
            self._log({metrics.GROUPS_RESAMPLED_AFTER_RESTORE: resampled})
        if own.get(OFFLINE_STATE) is not None and hasattr(self.offline_data, "set_position"):
            self.offline_data.set_position(own[OFFLINE_STATE], batch_rows=self.config.offline_rows_per_step)
        self._rng.bit_generator.state = own[BATCH_RNG_STATE]
        self._rows_trained = int(own[ROWS_TRAINED])
        self._skipped_nonfinite = int(own.get(SKIPPED_NONFINITE, 0))

    def restore_from_path(self, path, *args, **kwargs):
        super().restore_from_path(path, *args, **kwargs)
        self._weight_sync.push_restored(int(self.iteration or 0))
        if self._recorder is not None:  # iterations after the checkpoint are recorded again, not twice
            self._recorder.forget_after(int(self.iteration or 0))

    def export_hf(self, path: str, merged: bool = False) -> str:
        """Write the current policy as a Hugging Face model directory (weights + config + tokenizer). Under LoRA: the
        adapter in peft format (load it with ``peft.PeftModel.from_pretrained(base, path)``), or with ``merged`` a
        full model with the adapter merged in."""
        self._weight_sync.settle()
        results = self.learner_group.foreach_learner(
            lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().save_pretrained(path, merged=merged))
        return [r.get() for r in results][0]


# The config builds this algorithm by default (it cannot import this module: see `P3OConfig.default_algo_class`).
P3OConfig.default_algo_class = P3O
