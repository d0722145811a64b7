"""A line on the screen while a run waits for its first result: what it waits for and for how long.

Before the status table's first row a run spends most of a minute on 2 CPU cores with nothing to show: the trial
starts (the vLLM engines load the model, the learners build theirs, the first weights are pushed and checked), then
the first iteration runs (the held-out evaluation of the untrained model, sampling, the first update). `WaitNotices`
names the phase once it has lasted ``first_after_s`` (10 s), and again every ``every_s`` (30 s), so that a person
knows the run is alive and what it is doing; `rllib_p3o.driver.progress.IterationPrinter` calls it from Tune's loop.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

STARTING = "starting the trial: the vLLM engine(s), the learner(s) and the first weight sync"
FIRST_ITERATION = "iteration 1: the held-out evaluation (if any), sampling and the first update"
FIRST_NOTICE_S = 10.0
REPEAT_S = 30.0


class WaitNotices:
    """The notice of the current wait, due ``first_after_s`` after it began and every ``every_s`` after that."""

    def __init__(
        self,
        first_after_s: float = FIRST_NOTICE_S,
        every_s: float = REPEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.first_after_s = first_after_s
        self.every_s = every_s
        self._clock = clock
        self._phase: Optional[str] = None
        self._began = 0.0
        self._due = 0.0

    def begin(self, phase: str) -> None:
        """A new wait starts now: ``phase`` says what it waits for."""
        self._phase = phase
        self._began = self._clock()
        self._due = self._began + self.first_after_s

    def end(self) -> None:
        """The wait is over (a result came): no more notices until the next `begin`."""
        self._phase = None

    def due(self) -> Optional[str]:
        """The notice to print now, or None (no wait, or not due yet)."""
        if self._phase is None:
            return None
        now = self._clock()
        if now < self._due:
            return None
        self._due = now + self.every_s
        waited = int(now - self._began)
        return f"  ... {self._phase} ({waited // 60}:{waited % 60:02d})"
