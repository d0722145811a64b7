"""Data on its way to the learner: prompt schedule, chat rendering, completion records -> padded batches, the
trajectory Parquet format (schema, validator, recorder), RLlib's offline hooks and the batch sources.

The trajectory API is re-exported here (it was ``rllib_p3o.offline``, which still imports)."""

from rllib_p3o.core.sources import offline_source_name, source_id
from rllib_p3o.data.recorder import TrajectoryRecorder, records_to_table
from rllib_p3o.data.trajectories import (
    OfflineDataError,
    Problem,
    ValidationReport,
    check_row,
    list_parquet_files,
    row_to_record,
    validate_trajectories,
)

__all__ = [
    "OfflineDataError",
    "Problem",
    "TrajectoryRecorder",
    "ValidationReport",
    "check_row",
    "list_parquet_files",
    "offline_source_name",
    "records_to_table",
    "row_to_record",
    "source_id",
    "validate_trajectories",
]
