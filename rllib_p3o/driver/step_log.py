"""What one training iteration reports under ``p3o/`` (`rllib_p3o.core.metrics` names the keys): the step's figures
(`metrics.step_metrics`), the run's counters, the runners' health, per source and per reward function, and the
sampled completions written to files (``log_completions``); and the one warning about completions no reward function
scored."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o.core import metrics
from rllib_p3o.core.columns import Record
from rllib_p3o.core.sources import SourceNames
from rllib_p3o.data.completion_samples import write_samples
from rllib_p3o.driver.progress import unscored_warning

logger = logging.getLogger(__name__)

# Where a trial's sampled completions go: (directory, its pyarrow filesystem or None for a local one).
CompletionsDir = Callable[[], Tuple[str, Any]]


class StepLog:
    """Logs an iteration's figures into the algorithm's `MetricsLogger` (a new one per trial: build a new `StepLog`
    with it). ``under_tune``: a Tune trial, whose screen warnings the status table's printer gives instead."""

    def __init__(self, logger_: MetricsLogger, source_names: SourceNames, under_tune: bool = False):
        self.metrics, self.source_names, self.under_tune = logger_, source_names, under_tune
        self._warned_unscored = False
        self._token_rate = metrics.TokenRate()  # the screen's tokens/s, over the last iterations

    def log_step(self, algo: Any, records, batch, timings, sync_stats, per_learner_ess) -> None:
        """One training step of ``algo`` (a `P3O`): its figures (`metrics.step_metrics` of its records, batch, phase
        timings, sync and per-learner ESS), the run's counters and its runners' health (`log_iteration`)."""
        cfg = algo.config
        offline = algo.offline_data
        step = metrics.step_metrics(
            records,
            batch,
            timings,
            sync_stats,
            per_learner_ess,
            num_offline_rows=cfg.offline_rows_per_step,
            weights_seq_no=algo._weight_sync.weights_seq_no,
            offline_rows_skipped=getattr(offline, "rows_skipped", 0) if offline is not None else None,
            offline_files=offline.provenance_counts() if hasattr(offline, "provenance_counts") else None,
        )
        if records:  # generated tokens per second of the last iterations (their time, without evaluations)
            seconds = sum(v for k, v in timings.items() if k != metrics.TIME_EVAL_S)
            step[metrics.RECENT_TOKENS_PER_S] = self._token_rate.add(step[metrics.GENERATED_TOKENS], seconds)
        step.update(
            {
                metrics.SKIPPED_NONFINITE_STEPS: algo._run.skipped_nonfinite,
                metrics.ROLLOUT_FP8_SIMULATED: float(cfg.rollout_weights.fp8_simulated),
                # Every iteration, so that the key is a column from the first result on (`metrics.ResultColumns`).
                metrics.GROUPS_RESAMPLED_AFTER_RESTORE: 0.0,
                **getattr(algo, "_prompt_fit", {}),
                **algo._run.take_restore_metrics(),
            }
        )
        runners = None
        if algo._runners.remote:
            runners = {
                metrics.HEALTHY_ENV_RUNNERS: len(algo._runners.healthy_ids()),
                metrics.ENV_RUNNER_RESTARTS_LIFETIME: algo._runner_restarts,
            }
        completions = (int(cfg.log_completions), algo._completions_dir) if cfg.log_completions else None
        self.log_iteration(int(algo.iteration or 0) + 1, records, step, runners, completions)

    def log(self, step: Mapping[str, float]) -> None:
        """``p3o/<key>`` for each item, this iteration's value."""
        for key, value in step.items():
            self.metrics.log_value((metrics.P3O, key), value, window=1)

    def log_by_source(self, by_source: Mapping[Tuple[str, str], float]) -> None:
        """``p3o/by_source/<name>/<key>``."""
        for (name, key), value in by_source.items():
            self.metrics.log_value((metrics.P3O, metrics.BY_SOURCE, name, key), value, window=1)

    def log_iteration(
        self,
        iteration: int,
        records: List[Dict[str, Any]],
        step: Mapping[str, float],
        runners: Optional[Mapping[str, float]] = None,
        completions: Optional[Tuple[int, CompletionsDir]] = None,
    ) -> None:
        """One iteration (``iteration``, counted from 1): its figures ``step`` (`metrics.step_metrics` and the run's
        counters), the runners' health where they are remote, and from its completion records the per-source and
        per-function figures; ``completions``: (how many to write, where) when ``log_completions`` asks."""
        self.log(step)
        if runners:
            self.log(runners)
        if not records:
            return
        self._warn_unscored(iteration, records)
        self.log_by_source(metrics.records_by_source(records, self.source_names))
        for name, mean in metrics.rewards_by_function(records).items():
            self.metrics.log_value((metrics.P3O, metrics.REWARDS, name), mean, window=1)
        if completions:
            count, where = completions
            directory, filesystem = where()
            write_samples(records, directory, iteration, count, filesystem)

    def _warn_unscored(self, iteration: int, records: List[Dict[str, Any]]) -> None:
        """The first iteration with completions no reward function scored, as a warning on the driver. Under Tune the
        status table's printer says it on the user's screen (`IterationPrinter`; a trial's log may not reach it)."""
        if self._warned_unscored or self.under_tune:
            return
        unscored = sum(1 for record in records if record[Record.REWARD] != record[Record.REWARD])  # NaN
        if unscored:
            logger.warning(unscored_warning(iteration, unscored, len(records)))
            self._warned_unscored = True
