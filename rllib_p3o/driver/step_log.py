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
