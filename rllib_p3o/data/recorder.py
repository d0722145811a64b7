"""The recorder: online completion records → trajectory Parquet files (the schema of `rllib_p3o.data.trajectories`).

``record_rollouts=DIR`` writes one file per iteration, under a temporary name and renamed: a file is complete or
absent, whatever happens to the run. ``DIR`` is a local path or a URI (``s3://bucket/traj``, ...) that pyarrow's
filesystems open (`rllib_p3o.core.storage`). The prompt column holds the prompt as the engine saw it (a conversational
prompt rendered by the chat template); the ids columns are authoritative. A completion no reward function scored
(its reward NaN in the run) is recorded with a null reward: valid, and left out of offline training, counted
(`rllib_p3o.data.trajectories`). Every row names the model that sampled it (``model_name``, ``model_fingerprint``,
with its ``policy_version``: `rllib_p3o.data.provenance`), so a run that reads the file later can tell its own data
from another model's.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from rllib_p3o.core import columns, storage
from rllib_p3o.core.columns import Infos, Record
from rllib_p3o.core.sources import POLICY
from rllib_p3o.data.provenance import MODEL_FINGERPRINT, MODEL_NAME
from rllib_p3o.data.trajectories import LOSS_MASK

# A data source's writer as recorded: (model_name, model_fingerprint), by source name (``policy``, ``behavior/<name>``).
Writers = Mapping[str, Tuple[str, Optional[str]]]

# pyarrow types of the declared fields' trajectory columns (`rllib_p3o.core.columns.Field.arrow`).
ARROW_TYPES = {
    "int64": lambda pa: pa.int64(),
    "float32": lambda pa: pa.float32(),
    "string": lambda pa: pa.string(),
    "list<float32>": lambda pa: pa.list_(pa.float32()),
    "list<int32>": lambda pa: pa.list_(pa.int32()),
    "list<int64>": lambda pa: pa.list_(pa.int64()),
    "list<int8>": lambda pa: pa.list_(pa.int8()),
}


def records_to_table(records: Iterable[Mapping[str, Any]], writers: Optional[Writers] = None):
    """Online completion records → a pyarrow table in the trajectory schema: the completion's texts and tokens, its
    reward, every declared field with a trajectory column (`rllib_p3o.core.columns.FIELDS`), its source, the model
    that sampled it (``writers``, by source name; null where it names none) and sampling parameters, and the
    multi-turn loss mask."""
    import pyarrow as pa

    recorded = [f for f in columns.FIELDS if f.file]
    rows = []
    for r in records:
        infos = r.get(Record.INFOS) or {}
        source = str(infos.get(Infos.SOURCE, POLICY))
        name, fp = (writers or {}).get(source, (None, None))
        rows.append(
            {
                "prompt": infos.get(Infos.PROMPT),
                "prompt_ids": [int(i) for i in r[Record.PROMPT_IDS]],
                "completion": infos.get(Infos.COMPLETION),
                "completion_ids": [int(i) for i in r[Record.COMPLETION_IDS]],
                "reward": _reward(r[Record.REWARD]),
                **{f.file: columns.to_file(f, r.get(f.key)) for f in recorded},
                "source": source,
                MODEL_NAME: name,
                MODEL_FINGERPRINT: fp,
                "temperature": infos.get(Infos.TEMPERATURE),
                "top_p": infos.get(Infos.TOP_P),
                LOSS_MASK: [int(v) for v in r[Record.LOSS_MASK]] if r.get(Record.LOSS_MASK) is not None else None,
            }
        )
    schema = pa.schema(
        [
            ("prompt", pa.string()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("completion", pa.string()),
            ("completion_ids", pa.list_(pa.int32())),
            ("reward", pa.float32()),
            *[(f.file, ARROW_TYPES[f.arrow](pa)) for f in recorded],
            ("source", pa.string()),
            (MODEL_NAME, pa.string()),
            (MODEL_FINGERPRINT, pa.string()),
            ("temperature", pa.float32()),
            ("top_p", pa.float32()),
            (LOSS_MASK, pa.list_(pa.int8())),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _reward(reward: Any):
    """A record's reward as recorded: None (null) for an unscored completion (NaN in the run)."""
    reward = float(reward)
    return None if math.isnan(reward) else reward


class TrajectoryRecorder:
    """Writes batches of completion records as Parquet files ``part-<iteration>.parquet`` under ``directory`` (a
    local path or a URI, `rllib_p3o.core.storage`).

    Each file is written under a hidden temporary name, flushed to disk and renamed into place, so a reader (or a
    resumed run) sees complete files only, even if the run is killed mid-write. A run restored from a checkpoint
    calls `forget_after`, so the iterations it trains again are recorded once, not twice. The directory is created
    when the recorder is, so a path or bucket that cannot be written fails before training starts.
    """

    _PART = re.compile(r"^\.?part-(\d+)\.parquet(\.tmp)?$")

    def __init__(self, directory: str, writers: Optional[Writers] = None):
        self.location = storage.locate(directory)
        self.location.makedirs()
        self.directory = self.location.uri
        self.writers = dict(writers or {})  # source name -> (model_name, model_fingerprint): `records_to_table`

    def write(self, records: Sequence[Mapping[str, Any]], iteration: int) -> str:
        """Write one iteration's file; returns its path or URI."""
        import pyarrow.parquet as pq

        table = records_to_table(records, self.writers)
        final = self.location.child(f"part-{iteration:07d}.parquet")
        final.write_atomically(lambda tmp: pq.write_table(table, tmp.path, filesystem=tmp.filesystem))
        return final.uri

    def forget_after(self, iterations_done: int) -> List[str]:
        """Delete the files of iterations ``>= iterations_done`` (written after the checkpoint being restored)
        and any half-written temporary file; returns the deleted file names."""
        import pyarrow.fs

        removed = []
        infos = self.location.filesystem.get_file_info(pyarrow.fs.FileSelector(self.location.path))
        for info in sorted(infos, key=lambda i: i.base_name):
            m = self._PART.match(info.base_name)
            if info.type == pyarrow.fs.FileType.File and m and (m.group(2) or int(m.group(1)) >= iterations_done):
                self.location.filesystem.delete_file(info.path)
                removed.append(info.base_name)
        return removed
