"""Former home of the trajectory schema, validator and recorder: they live in `rllib_p3o.trajectories` (the file
format), `rllib_p3o.recorder` (writing it) and `rllib_p3o.sources` (source names and ids). This module keeps the old
imports working."""

from rllib_p3o.recorder import TrajectoryRecorder, records_to_table
from rllib_p3o.sources import offline_source_name, source_id
from rllib_p3o.trajectories import (
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
