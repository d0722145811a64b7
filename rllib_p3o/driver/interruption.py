"""A Tune run that did not finish says so: the interruption (Ctrl-C) and the exact call that resumes it on the screen,
and a script that exits non-zero instead of reporting an unfinished run's last numbers as its result.

On SIGINT, Tune ends the run, saves its experiment state and returns from ``Tuner.fit()`` normally; the trials it
stopped count as TERMINATED in the result grid, like finished ones. Its notice ("Experiment has been interrupted
... Resume experiment with: Tuner.restore(path=..., trainable=...)") is a warning of Tune's logger, below the ERROR
level that ``import rllib_p3o`` keeps Tune's loggers at (`rllib_p3o.core.quiet`), and it leaves the trainable out.
`show_tune_interruptions` lets Tune's two notices about an interruption through (the signal received, the run
interrupted), the second rewritten with the exact restore call (`restore_call`); `exit_unless_finished` is the check
a script makes before it prints a final result: a trial that failed or did not reach its stopping condition ends the
script with a non-zero status.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from typing import Any, List, Optional

from rllib_p3o.driver.experiment_state import newest_state_file

# Tune's logger of ``tune.run``, which announces the signal and the interruption.
TUNE_RUN_LOGGER = "ray.tune.tune"
SIGNAL_NOTICE = "Stop signal received"
INTERRUPTED_NOTICE = "Experiment has been interrupted"
_EXPERIMENT_PATH = re.compile(r'path="([^"]+)"')
# Exit statuses of `exit_unless_finished`: a failed trial, and an interrupted run (128 + SIGINT, as a shell reports
# a program that Ctrl-C ended).
FAILED_EXIT_STATUS = 1
INTERRUPTED_EXIT_STATUS = 130


def restore_call(experiment_path: str) -> str:
    """The Python call that resumes the experiment at ``experiment_path``: ``tune.Tuner.restore(path, trainable=NAME)``
    with the trainable's registered name read from Tune's experiment state (``"P3O"`` for P3O's runs)."""
    trainable = _trainable_name(experiment_path)
    return f"tune.Tuner.restore({experiment_path!r}, trainable={trainable!r}).fit()"


def _trainable_name(experiment_path: str) -> str:
    """The trainable's name as the experiment state records it; "P3O" when it cannot be read."""
    try:
        with open(newest_state_file(experiment_path) or "") as f:
            trial = json.loads(json.load(f)["trial_data"][0][0])
        return str(trial["trainable_name"])
    except (IndexError, KeyError, OSError, TypeError, ValueError):
        return "P3O"


def interruption_notice(experiment_path: str) -> str:
    """What a person reads after Ctrl-C: the run did not finish, and how to resume it (from each trial's latest
    checkpoint; a trial without one would start over, which P3O refuses: `NothingToResumeError`)."""
    checkpoints = glob.glob(os.path.join(experiment_path, "*", "checkpoint_*"))
    resume = (
        f"Resume it from each trial's latest checkpoint with: {restore_call(experiment_path)}"
        if checkpoints
        else (
            "No trial has a checkpoint yet, so it cannot be resumed: Ctrl-C came before the first one "
            "(checkpoint_at_end does not run on Ctrl-C). tune.CheckpointConfig(checkpoint_frequency=N) writes one "
            "every N iterations: a smaller N makes a run resumable sooner."
        )
    )
    return f"Interrupted: the run did not finish; its state is saved in {experiment_path}. {resume}"


class _InterruptionNotices(logging.Filter):
    """On Tune's run logger: Tune's interruption notice rewritten as `interruption_notice`; with ``quiet``, every
    other record below ERROR dropped (the logger is held at WARNING for these two notices only)."""

    def __init__(self, quiet: bool):
        super().__init__()
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(INTERRUPTED_NOTICE):
            found = _EXPERIMENT_PATH.search(record.getMessage())
            if found:
                record.msg, record.args = interruption_notice(found.group(1)), None
            return True
        return record.levelno >= logging.ERROR or not self.quiet or message.startswith(SIGNAL_NOTICE)


def show_tune_interruptions(quiet: bool) -> None:
    """Install `_InterruptionNotices` on Tune's run logger (idempotent). ``quiet``: the libraries' chatter is hidden
    (`rllib_p3o.core.quiet`), so the logger is opened to WARNING for the two notices alone."""
    tune_run = logging.getLogger(TUNE_RUN_LOGGER)
    if any(isinstance(f, _InterruptionNotices) for f in tune_run.filters):
        return
    tune_run.addFilter(_InterruptionNotices(quiet))
    if quiet:
        tune_run.setLevel(logging.WARNING)


def unfinished_trials(results: Any) -> List[Any]:
    """The results of ``Tuner.fit()`` whose trial failed or stopped before its stopping condition (Ctrl-C): Tune marks
    a result ``done`` only when the trial's stopping condition was met."""
    return [result for result in results if result.error is not None or not (result.metrics or {}).get("done")]


def exit_unless_finished(results: Any) -> None:
    """End the script unless every trial of ``Tuner.fit()``'s results finished: with status 1 when one failed (Tune
    printed its error), 130 when the run was interrupted (the notice with the restore call is printed above)."""
    unfinished = unfinished_trials(results)
    if not unfinished:
        return
    failed: Optional[Any] = next((r for r in unfinished if r.error is not None), None)
    raise SystemExit(FAILED_EXIT_STATUS if failed is not None else INTERRUPTED_EXIT_STATUS)
