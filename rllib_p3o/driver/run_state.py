"""What a P3O run carries from one iteration to the next besides RLlib's own state (weights, optimizer, iteration,
metrics): the batch sources' data positions, the batch shuffle's RNG, the rows trained, the non-finite steps
skipped, the result's columns and the latest held-out reward. It is saved in every checkpoint under `P3O_STATE`, so
a restored run samples, shuffles and reports what the uninterrupted one would (docs: "Fault tolerance and resume").
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from rllib_p3o.core import metrics
from rllib_p3o.driver.batch_sources import BatchSource

# Keys of P3O's own checkpoint state (in the algorithm's state, beside RLlib's components).
P3O_STATE = "p3o"
BATCH_RNG_STATE = "batch_rng"
ROWS_TRAINED = "rows_trained"
SKIPPED_NONFINITE = metrics.SKIPPED_NONFINITE_STEPS
RESULT_COLUMNS = "result_columns"
ITERATION = "iteration"  # the checkpoint's own iteration: set after restoring an older intact checkpoint instead
HELDOUT_REWARD = metrics.HELDOUT_REWARD


class RunState:
    """The run's own state (see the module docstring); one per trial (`P3O.reset_config` starts a new one)."""

    def __init__(self, seed: Optional[int], sources: Sequence[BatchSource] = ()):
        self.rng = np.random.default_rng(seed)  # shuffles each training batch's rows
        self.sources = list(sources)
        self.rows_trained = 0  # lifetime, RLlib's NUM_ENV_STEPS_SAMPLED_LIFETIME for the learners
        self.skipped_nonfinite = 0  # lifetime
        self.result_columns = metrics.ResultColumns()  # fixed by the trial's first result (or its checkpoint)
        self.heldout_reward = float("nan")  # of the latest held-out evaluation
        self.restore_metrics: Dict[str, float] = {}  # the sources' account of a restore, reported with the next result
        self.checkpoint_iteration: Optional[int] = None  # the iteration of the checkpoint last restored

    def get_state(self, iteration: int) -> Dict[str, Any]:
        """The state to save with a checkpoint taken after ``iteration`` iterations."""
        return {
            **{source.state_key: source.get_state() for source in self.sources},
            BATCH_RNG_STATE: self.rng.bit_generator.state,
            ROWS_TRAINED: self.rows_trained,
            SKIPPED_NONFINITE: self.skipped_nonfinite,
            RESULT_COLUMNS: self.result_columns.columns,
            ITERATION: iteration,
            HELDOUT_REWARD: self.heldout_reward,
        }

    def set_state(self, state: Dict[str, Any]) -> None:
        """Continue from `get_state`'s ``state`` (keys missing from an older checkpoint keep their start values)."""
        for source in self.sources:
            if state.get(source.state_key) is not None:
                self.restore_metrics.update(source.set_state(state[source.state_key]))
        self.rng.bit_generator.state = state[BATCH_RNG_STATE]
        self.rows_trained = int(state[ROWS_TRAINED])
        self.skipped_nonfinite = int(state.get(SKIPPED_NONFINITE, 0))
        self.result_columns = metrics.ResultColumns(state.get(RESULT_COLUMNS))
        self.heldout_reward = float(state.get(HELDOUT_REWARD, float("nan")))
        self.checkpoint_iteration = state.get(ITERATION)

    def take_restore_metrics(self) -> Dict[str, float]:
        """The sources' figures about the last restore, once (they are reported with the first result after it)."""
        taken, self.restore_metrics = self.restore_metrics, {}
        return taken
