"""RLlib offline-data hooks for trajectory Parquet: `P3OOfflineData` (validation, advantages, rescoring, batches for
the driver) and `P3OOfflinePreLearner` (rows → padded token batch, in Ray Data actors).

Wired in by P3OConfig: ``config.offline_data(input_=PATH)`` makes RLlib build `P3OOfflineData`, which reads the
files with Ray Data (``read_parquet``) and maps batches through `P3OOfflinePreLearner` in Ray Data actors. The file
format itself (schema, validation, rows → records) is `rllib_p3o.data.trajectories`.

Ray Data runs its read tasks and prelearner actors beside the trial, on CPUs the trial does not hold: on a cluster
where the trial holds them all (a laptop's 2 cores: the algorithm's process and one runner), they would wait
forever. So ``offline_reader="auto"`` (`choose_reader`) reads in the trial's own process there, with the same
prelearner and the same batches, and ``"ray_data"`` is refused before the trial starts
(`rllib_p3o.driver.preflight.check_cluster_fits`) with the CPUs it needs.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
import ray
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.offline.offline_prelearner import OfflinePreLearner

from rllib_p3o.core import metrics, storage
from rllib_p3o.core.columns import BATCH_COLUMNS, Record
from rllib_p3o.data import provenance
from rllib_p3o.data.batching import Batch, empty_batch, pad_records
from rllib_p3o.data.provenance import MODEL_FINGERPRINT, RECORDER
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

# `offline_reader` values (`rllib_p3o.core.settings`): Ray Data when the cluster has CPUs for it beside the trial,
# else the trial's own process; always Ray Data; always the trial's own process.
AUTO, RAY_DATA, IN_PROCESS = "auto", "ray_data", "in_process"
OFFLINE_READERS = (AUTO, RAY_DATA, IN_PROCESS)


def ray_data_cpus(config) -> float:
    """CPUs Ray Data needs beside the trial to read the offline data: the prelearner actors (RLlib's
    ``map_batches_kwargs``: ``concurrency`` actors, the least of a range, ``num_cpus`` each, default 1; RLlib starts
    ``max(2, num_learners)``) and one more for the read and group-by tasks that feed them."""
    kwargs = {"concurrency": max(2, int(config.num_learners)), **(config.map_batches_kwargs or {})}
    concurrency = kwargs["concurrency"]
    actors = min(concurrency) if isinstance(concurrency, (tuple, list)) else int(concurrency or 1)
    return actors * float(kwargs.get("num_cpus", 1) or 0) + 1.0


def spare_cpus(config, trial_cpus: Optional[float] = None) -> float:
    """The Ray cluster's CPUs less what this algorithm holds: ``trial_cpus`` when given, else its placement group's
    (a Tune trial's: the algorithm's process, runners and learners), else its runners' and learners' (built
    directly, where the driver is no actor). Not what is free now: other trials come and go."""
    import ray
    from ray.rllib.algorithms.utils import _get_env_runner_bundles, _get_learner_bundles

    if trial_cpus is None:
        group = ray.util.get_current_placement_group()
        bundles = group.bundle_specs if group is not None else _get_env_runner_bundles(config)
        bundles = bundles + ([] if group is not None else _get_learner_bundles(config))
        trial_cpus = sum(float(b.get("CPU", 0) or 0) for b in bundles)
    return float(ray.cluster_resources().get("CPU", 0)) - trial_cpus


def choose_reader(config, trial_cpus: Optional[float] = None) -> str:
    """`RAY_DATA` or `IN_PROCESS` for ``config.offline_reader`` on the running cluster (module docstring)."""
    reader = getattr(config, "offline_reader", AUTO)
    if reader != AUTO:
        return reader
    return RAY_DATA if spare_cpus(config, trial_cpus) >= ray_data_cpus(config) else IN_PROCESS


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


def _floats(values) -> np.ndarray:
    """A column as float64, null (None) as NaN."""
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


GroupStats = Dict[Any, Tuple[float, float, int]]


def group_stats(locations: List[storage.Location]) -> GroupStats:
    """Each ``group_id``'s scored rewards over the whole dataset: ``{group_id: (mean, std, count)}``, as
    `rllib_p3o.core.batch_stats.group_advantages` computes them (sample std; unscored and non-finite rewards left out).
    Read on the driver from two columns, so that `fill_advantages` keeps the rows in file order."""
    rewards: Dict[Any, List[float]] = {}
    for location in locations:
        if "group_id" not in _column_names(location):
            continue  # its rows all have advantages (`P3OOfflineData._group_stats`)
        table = read_table(location, columns=["group_id", "reward"])
        for g, r in zip(table.column("group_id").to_pylist(), _floats(table.column("reward").to_pylist())):
            rewards.setdefault(g, [])
            if np.isfinite(r):
                rewards[g].append(float(r))
    stats: GroupStats = {}
    for g, values in rewards.items():
        r = np.asarray(values, dtype=np.float64)
        mean = float(r.mean()) if len(r) else 0.0
        std = float(np.sqrt(((r - mean) ** 2).sum() / max(len(r) - 1, 1))) if len(r) else 0.0
        stats[g] = (mean, std, len(r))
    return stats


def fill_advantages(batch: Dict[str, np.ndarray], stats: Optional[GroupStats]) -> Dict[str, np.ndarray]:
    """A batch of rows (Ray Data ``map_batches`` numpy format, or `_columns`) without its unscored rows, and with the
    missing advantages filled with the group-normalized reward of ``stats`` (`group_stats`; None: every row has
    one). Row by row, so the rows keep their order whichever reader reads them."""
    rewards = _floats(batch["reward"])
    keep = ~np.isnan(rewards)
    out = {k: np.asarray(v)[keep] for k, v in batch.items()}
    if stats is None:
        return out
    given = _floats(out["advantage"]) if "advantage" in out else np.full(int(keep.sum()), np.nan)
    advantages = given.copy()
    for i in np.flatnonzero(np.isnan(given)):
        mean, std, count = stats.get(out["group_id"][i], (0.0, 0.0, 0))
        r = rewards[keep][i]
        advantages[i] = (r - mean) / (std + 1e-8) if count > 1 and np.isfinite(r) else 0.0
    out["advantage"] = advantages.astype(np.float32)
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
      whole dataset (`group_stats`, on the driver), not over whichever rows a batch happens to hold.
    - Unscored rows (reward null: no reward function scored them, `rllib_p3o.data.trajectories`) are left out, with
      a warning that counts them; they and the bad rows skipped are ``offline_rows_skipped``.
    - Rows without ``behavior_logprobs`` are scored once by ``offline_rescore_model`` (if set).
    - Resume: rows are read in file order (Ray Data's ``preserve_order``; the in-process reader gives the same
      batches, advantages filled or not), so the position is the number of batches taken (`get_position`), whichever
      reader took them. Ray Data iterators cannot seek, so a restored run reads and discards the batches of the
      current epoch it had already trained on (`set_position`): no row is replayed or skipped, at the cost of
      reading them once more.
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
        if report.num_rows - report.skipped_rows <= 0:
            raise OfflineDataError("offline dataset has no valid rows:\n" + report.summary())
        if report.unscored:
            logger.warning(
                "offline data: %d of %d rows unscored (reward null: no reward function scored them; or NaN, in %d "
                "of them), left out of training",
                len(report.unscored),
                report.num_rows,
                len(report.nan_rewards),
            )
        self.rows_skipped = report.skipped_rows
        self.rows_per_epoch = report.num_rows - report.skipped_rows
        self.batches_taken = 0
        self.seed = int(config.seed or 0)
        self.shuffle = bool(getattr(config, "offline_shuffle", False))
        self.provenance = provenance.read_provenance(
            report.locations, config.policy_model, config.offline_provenance, config.input_
        )
        self.source_names: Set[str] = {name for f in self.provenance for name in f.source_names}
        logger.info("offline data %s", provenance.summary([f.reading for f in self.provenance]))
        self.reader = choose_reader(config)
        if self.reader == IN_PROCESS:
            self._read_in_process(config, report)
            return
        super().__init__(config)
        if any(f.reading.recorders.get(fp) is not None for f in self.provenance for fp in f.reading.recorders):
            # Another model's rows: the prelearner names them by their recorder, which their file decides.
            self.data = getattr(ray.data, self.data_read_method)(
                self.path, **{**self.data_read_method_kwargs, "include_paths": True}
            )
            by_file = {provenance.bare_path(f.reading.file): f.reading.recorders for f in self.provenance}
            self.data = self.data.map_batches(mark_recorders, fn_kwargs={"by_file": by_file}, batch_format="numpy")
        if self.shuffle:
            self.data = self.data.random_shuffle(seed=self.seed)
        self.data.context.execution_options.preserve_order = True  # a position must name the same rows again
        if rescore:
            self.data = self.data.map_batches(
                BehaviorRescorer,
                fn_constructor_kwargs={"model_path": rescore, "policy_model": config.policy_model},
                batch_format="numpy",
                concurrency=1,
                num_cpus=0.5,
            ).materialize()
        stats = self._group_stats(report)
        if stats is not None or report.unscored:
            self.data = self.data.map_batches(fill_advantages, fn_kwargs={"stats": stats}, batch_format="numpy")
        logger.info("offline data: %s", report.summary(limit=5))

    def _read_in_process(self, config, report) -> None:
        """`IN_PROCESS`: every row in memory, in file order, with what the Ray Data path adds (rescored behavior
        log-probs, group advantages over the whole dataset); batches go through the same prelearner here."""
        # What RLlib's Algorithm sets or reads on an OfflineData; it never samples from it (P3O does).
        self.config, self.path, self.data, self.batch_iterators = config, config.input_, None, None
        self.locality_hints = self.learner_handles = self.module_spec = self.spaces = None
        # The rows Ray Data's path gives the prelearner: without the bad ones it drops there (skip_bad_rows).
        bad = {(p.file, p.row) for p in report.problems}
        readings = {f.reading.file: f.reading for f in self.provenance}
        rows = [
            {**row, RECORDER: readings[location.uri].recorder(row.get(MODEL_FINGERPRINT))}
            for location in report.locations
            for i, row in enumerate(read_table(location).to_pylist())
            if (str(location), i) not in bad
        ]
        if config.offline_rescore_model and any(row.get("behavior_logprobs") is None for row in rows):
            scored = BehaviorRescorer(config.offline_rescore_model, config.policy_model)(_columns(rows))
            for row, logprobs in zip(rows, scored["behavior_logprobs"]):
                row["behavior_logprobs"] = logprobs
        stats = self._group_stats(report)
        if rows and (stats is not None or report.unscored):
            batch = fill_advantages(_columns(rows), stats)
            rows = [{k: batch[k][i] for k in batch} for i in range(len(batch["reward"]))]
        self._rows = rows
        self._next_row = 0
        self._pass = -1  # passes over the rows begun (`_sample_in_process`)
        self._order = np.arange(len(rows))
        self._prelearner = (config.prelearner_class or P3OOfflinePreLearner)(
            config=config, spaces=None, module_spec=None, module_state=None
        )
        logger.info("offline data, read in the trial's process: %s", report.summary(limit=5))

    def _sample_in_process(self, num_rows: int) -> Batch:
        """The next ``num_rows`` rows (the last batch of a pass fewer; then a new pass from the first row), as the
        Ray Data path's ``iter_batches`` gives them; with ``offline_shuffle``, each pass in its own order
        (`pass_order`)."""
        if self.batch_iterators is None or self._next_row >= len(self._rows):
            self._next_row, self.batch_iterators = 0, IN_PROCESS  # a pass under way (None: start one)
            self._pass += 1
            self._order = pass_order(len(self._rows), self.seed, self._pass, self.shuffle)
        chunk = [self._rows[i] for i in self._order[self._next_row : self._next_row + num_rows]]
        self._next_row += len(chunk)
        padded = self._prelearner(_columns(chunk))
        return {k: np.asarray(padded[f"{DEFAULT_MODULE_ID}/{k}"]) for k in BATCH_COLUMNS}

    def sample_batch(self, num_rows: int) -> Batch:
        """``num_rows`` rows as a learner batch, padded to ``offline_max_seq_len`` tokens (see `rllib_p3o.data.batching`)."""
        if self.reader == IN_PROCESS:
            self.batches_taken += 1
            return self._sample_in_process(num_rows)
        # A truthy module_state: the P3O prelearner needs no weights (RLlib would otherwise fetch them).
        mab = self.sample(num_samples=num_rows, num_shards=0, module_state={"unused": True})
        sb = mab.policy_batches[DEFAULT_MODULE_ID]
        self.batches_taken += 1
        return {k: np.asarray(sb[k]) for k in BATCH_COLUMNS}

    def reopened(self, config) -> "P3OOfflineData":
        """The next trial's offline data (`P3O.reset_config`): ``config``'s inputs, provenance and order from their
        first row, with what RLlib's Algorithm set on this one after building it (spaces, module spec, learners)."""
        self.batch_iterators = None  # release this one's Ray Data iterator
        fresh = type(self)(config)
        for name in ("spaces", "module_spec", "locality_hints", "learner_handles"):
            setattr(fresh, name, getattr(self, name, None))
        return fresh

    def provenance_counts(self) -> Dict[str, int]:
        """Files read as the policy's own data and as another model's (`rllib_p3o.data.provenance`)."""
        kinds = [f.reading.kinds for f in self.provenance]
        return {
            metrics.OFFLINE_FILES_POLICY: sum(provenance.POLICY_OWN in k for k in kinds),
            metrics.OFFLINE_FILES_OTHER_MODEL: sum(provenance.OTHER_MODEL in k for k in kinds),
        }

    def get_position(self) -> Dict[str, int]:
        return {BATCHES_TAKEN: self.batches_taken}

    def set_position(self, position: Dict[str, int], batch_rows: int) -> int:
        """Continue after the batches a checkpointed run took (``batch_rows`` rows each, the last of an epoch fewer):
        discard those of the current epoch. Returns how many were discarded."""
        taken = int(position[BATCHES_TAKEN])
        per_epoch = -(-self.rows_per_epoch // batch_rows)
        self.batch_iterators = None  # a fresh pass from the first row
        self._pass = taken // per_epoch - 1  # in process: the pass under way draws its own order again
        discard = taken % per_epoch
        for _ in range(discard):
            self.sample_batch(batch_rows)
        self.batches_taken = taken
        return discard

    @staticmethod
    def _group_stats(report) -> Optional[GroupStats]:
        """`group_stats` where a row has no advantage, else None."""
        missing = False
        for location in report.locations:
            names = _column_names(location)
            if "advantage" not in names or read_table(location, columns=["advantage"]).column("advantage").null_count:
                missing = True
                if "group_id" not in names:
                    raise OfflineDataError(f"{location}: rows without 'advantage' need a 'group_id' column")
        return group_stats(report.locations) if missing else None


def _columns(rows: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Rows as the column arrays of a Ray Data numpy batch (object arrays: a list column stays one list per row)."""
    batch = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        column = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            column[i] = row.get(key)
        batch[key] = column
    return batch


def _column_names(location: storage.Location) -> List[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(location.path, filesystem=location.filesystem).names


def pass_order(num_rows: int, seed: int, pass_index: int, shuffle: bool) -> np.ndarray:
    """The order of the rows in pass ``pass_index`` over the data: a permutation drawn from (``seed``, pass) with
    ``shuffle`` (two seeds train on different batches; a restored run draws the same), else file order."""
    if not shuffle:
        return np.arange(num_rows)
    return np.random.default_rng([int(seed), int(pass_index)]).permutation(num_rows)


def mark_recorders(batch: Dict[str, np.ndarray], by_file: Dict[str, Dict[Optional[str], Optional[str]]]):
    """Ray Data ``map_batches``: each row's recorder (None: the policy's own data) from its file (``path``, Ray
    Data's ``include_paths`` column) and its ``model_fingerprint``, in `RECORDER`; the path column dropped."""
    paths = batch.pop("path")
    fps = batch.get(MODEL_FINGERPRINT, np.full(len(paths), None, dtype=object))
    recorders = np.empty(len(paths), dtype=object)
    for i, (path, fp) in enumerate(zip(paths, fps)):
        recorders[i] = by_file.get(provenance.bare_path(str(path)), {}).get(fp if isinstance(fp, str) and fp else None)
    batch[RECORDER] = recorders
    return batch


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
