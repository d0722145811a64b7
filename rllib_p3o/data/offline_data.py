"""RLlib offline-data hooks for trajectory Parquet: `P3OOfflineData` (validation, advantages, rescoring, batches for
the driver) and `P3OOfflinePreLearner` (rows → padded token batch, in Ray Data actors).

Wired in by P3OConfig: ``config.offline_data(input_=PATH)`` makes RLlib build `P3OOfflineData`, which reads the
files with Ray Data (``read_parquet``) and maps batches through `P3OOfflinePreLearner` in Ray Data actors. The file
format itself (schema, validation, rows → records) is `rllib_p3o.data.trajectories`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Set

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.offline.offline_prelearner import OfflinePreLearner

from rllib_p3o.core import storage
from rllib_p3o.core.columns import BATCH_COLUMNS, Record
from rllib_p3o.core.objectives import group_advantages
from rllib_p3o.core.sources import OFFLINE, offline_source_name
from rllib_p3o.data.batching import Batch, empty_batch, pad_records
from rllib_p3o.data.trajectories import (
    OfflineDataError,
    check_row,
    read_table,
    row_to_record,
    validate_trajectories,
)

logger = logging.getLogger(__name__)

# Key of the offline position in a checkpoint.
BATCHES_TAKEN = "batches_taken"


def _tokenizer(config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.policy_model, trust_remote_code=config.trust_remote_code)


def input_filesystem(config) -> Any:
    """The pyarrow filesystem of RLlib's ``input_filesystem`` setting (None: from each path or URI), built as RLlib's
    `OfflineData` builds it, so that validation reads the files Ray Data will read."""
    import pyarrow.fs

    fs, kwargs = config.input_filesystem, config.input_filesystem_kwargs or {}
    if fs is None or isinstance(fs, pyarrow.fs.FileSystem):
        return fs
    if fs == "s3":
        return pyarrow.fs.S3FileSystem(**kwargs)
    if fs == "gcs":
        import gcsfs

        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(gcsfs.GCSFileSystem(**kwargs)))
    if fs == "abs":
        import adlfs

        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(adlfs.AzureBlobFileSystem(**kwargs)))
    raise storage.StorageError(f"unknown input_filesystem {fs!r} (None, a pyarrow FileSystem, 's3', 'gcs' or 'abs')")


def _normalize_group(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Ray Data ``map_groups`` function: fill missing advantages with the group-normalized reward."""
    rewards = np.asarray(batch["reward"], dtype=np.float32)
    import torch

    adv = group_advantages(torch.from_numpy(rewards), torch.zeros(len(rewards), dtype=torch.long)).numpy()
    given = batch.get("advantage")
    if given is not None:
        given = np.asarray([np.nan if v is None else v for v in given], dtype=np.float32)
        adv = np.where(np.isnan(given), adv, given)
    out = dict(batch)
    out["advantage"] = adv.astype(np.float32)
    return out


class BehaviorRescorer:
    """Ray Data callable: fills missing ``behavior_logprobs`` with log-probs under a named model (run once)."""

    def __init__(self, model_path: str, policy_model: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(policy_model)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        n = len(batch["reward"])
        scored: List[Any] = []
        for i in range(n):
            row = {k: batch[k][i] for k in batch}
            existing = row.get("behavior_logprobs")
            if existing is not None:
                scored.append(np.asarray(existing, dtype=np.float32))
                continue
            rec = row_to_record(dict(row, behavior_logprobs=[]), self.tokenizer)
            ids = np.concatenate([rec[Record.PROMPT_IDS], rec[Record.COMPLETION_IDS]])
            with self.torch.no_grad():
                x = self.torch.as_tensor(ids)[None]
                lp = self.torch.log_softmax(self.model(input_ids=x).logits[0, :-1].float(), -1)
                lp = lp.gather(-1, x[0, 1:, None])[:, 0].numpy()
            scored.append(lp[len(rec[Record.PROMPT_IDS]) - 1 :].astype(np.float32))
        out = dict(batch)
        out["behavior_logprobs"] = np.array(scored + [None], dtype=object)[:-1]
        return out


class P3OOfflineData(OfflineData):
    """RLlib `OfflineData` that validates trajectory files before anything runs and prepares advantages.

    - Every file and row is checked against the schema first (`rllib_p3o.data.trajectories`); a bad row stops the run before
      it starts, with file/row/column in the error, unless ``offline_skip_bad_rows`` (then bad rows are dropped
      and counted in ``offline_rows_skipped``).
    - Rows without ``advantage`` get the group-normalized reward of their ``group_id`` group, computed over the
      whole dataset (Ray Data ``groupby``), not over whichever rows a batch happens to hold.
    - Rows without ``behavior_logprobs`` are scored once by ``offline_rescore_model`` (if set).
    - Resume: rows are read in a fixed order (Ray Data's ``preserve_order``), so the position is the number of
      batches taken (`get_position`). Ray Data iterators cannot seek, so a restored run reads and discards the
      batches of the current epoch it had already trained on (`set_position`): no row is replayed or skipped, at
      the cost of reading them once more.
    """

    def __init__(self, config):
        tokenizer = _tokenizer(config)
        rescore = config.offline_rescore_model
        report = validate_trajectories(
            config.input_,
            filesystem=input_filesystem(config),
            tokenizer=tokenizer,
            require_behavior=not rescore,
            max_seq_len=config.offline_max_seq_len,
        )
        self.validation_report = report
        if not report.ok and not config.offline_skip_bad_rows:
            raise OfflineDataError(
                "offline dataset failed validation (set offline_skip_bad_rows=True to drop bad "
                "rows instead):\n" + report.summary()
            )
        if report.num_rows - report.bad_rows <= 0:
            raise OfflineDataError("offline dataset has no valid rows:\n" + report.summary())
        self.rows_skipped = report.bad_rows
        self.rows_per_epoch = report.num_rows - report.bad_rows
        self.batches_taken = 0
        self.source_names: Set[str] = _source_names(report.locations)
        super().__init__(config)
        if rescore:
            self.data = self.data.map_batches(
                BehaviorRescorer,
                fn_constructor_kwargs={"model_path": rescore, "policy_model": config.policy_model},
                batch_format="numpy",
                concurrency=1,
                num_cpus=0.5,
            ).materialize()
        if "advantage" not in self.data.columns() or self._has_missing_advantages():
            if "group_id" not in self.data.columns():
                raise OfflineDataError(f"{report.files}: rows without 'advantage' need a 'group_id' column")
            self.data = self.data.groupby("group_id").map_groups(_normalize_group, batch_format="numpy")
        self.data.context.execution_options.preserve_order = True  # a position must name the same rows again
        logger.info("offline data: %s", report.summary(limit=5))

    def sample_batch(self, num_rows: int) -> Batch:
        """``num_rows`` rows as a learner batch, padded to ``offline_max_seq_len`` tokens (see `rllib_p3o.data.batching`)."""
        # A truthy module_state: the P3O prelearner needs no weights (RLlib would otherwise fetch them).
        mab = self.sample(num_samples=num_rows, num_shards=0, module_state={"unused": True})
        sb = mab.policy_batches[DEFAULT_MODULE_ID]
        self.batches_taken += 1
        return {k: np.asarray(sb[k]) for k in BATCH_COLUMNS}

    def get_position(self) -> Dict[str, int]:
        return {BATCHES_TAKEN: self.batches_taken}

    def set_position(self, position: Dict[str, int], batch_rows: int) -> int:
        """Continue after the batches a checkpointed run took (``batch_rows`` rows each, the last of an epoch fewer):
        discard those of the current epoch. Returns how many were discarded."""
        taken = int(position[BATCHES_TAKEN])
        per_epoch = -(-self.rows_per_epoch // batch_rows)
        self.batch_iterators = None  # a fresh pass from the first row
        discard = taken % per_epoch
        for _ in range(discard):
            self.sample_batch(batch_rows)
        self.batches_taken = taken
        return discard

    def _has_missing_advantages(self) -> bool:
        return any(
            read_table(f, columns=["advantage"]).column("advantage").null_count
            for f in self.validation_report.locations
        )


def _source_names(files: List[storage.Location]) -> Set[str]:
    names = {OFFLINE}
    for f in files:
        try:
            table = read_table(f, columns=["source"])
        except (KeyError, ValueError, OSError):
            continue
        names |= {offline_source_name(s) for s in table.column("source").to_pylist()}
    return names


class P3OOfflinePreLearner(OfflinePreLearner):
    """Maps a Ray Data batch of trajectory rows to the learner's padded token batch (fixed width
    ``offline_max_seq_len``, so every batch has the same shape; `batching.concat_padded` cuts the padding).
    """

    def __init__(self, config, spaces=None, module_spec=None, module_state=None, **kwargs):
        # OfflinePreLearner.__init__ would build the full RLModule (the LLM) in every data actor: not needed here.
        self.config = config
        self.tokenizer = _tokenizer(config)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.width = int(config.offline_max_seq_len)
        self.skip_bad_rows = bool(config.offline_skip_bad_rows)

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        n = len(batch["reward"])
        records = []
        for i in range(n):
            row = {k: batch[k][i] for k in batch}
            if self.skip_bad_rows and check_row(
                row, vocab_size=len(self.tokenizer), tokenizer=self.tokenizer, max_seq_len=self.width
            ):
                continue  # counted once by the driver's validation report
            rec = row_to_record(row, self.tokenizer)
            # Every row has one by now: P3OOfflineData filled the missing ones with group z-scores.
            rec[Record.ADVANTAGE] = float(row["advantage"])
            records.append(rec)
        padded = pad_records(records, pad_id=self.pad_id, pad_to=self.width) if records else empty_batch(self.width)
        return {f"{DEFAULT_MODULE_ID}/{k}": v for k, v in padded.items()}
