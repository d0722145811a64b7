"""Online sampling for one training step, synchronous or asynchronous: which runner samples which prompt groups,
what happens when a runner dies, and the staleness of what is sampled.

Prompt groups come from the driver's `PromptSchedule` (`rllib_p3o.data.prompt_schedule`): the sampler hands each runner
its groups, so the data position is the driver's and goes into the checkpoint (`get_state`).

Staleness of a record = weights versions between the policy that sampled it and the learner's current weights
(``weights_seq_no`` at the learner - ``weights_seq_no`` of the record). Only the policy's own records have one; the
others (behavior models) get -1, as offline rows do.

Sync mode: the step's groups are split over the healthy runners, which sample with the latest weights (synced after
the last update), so staleness is 0. The groups of a runner that dies are sampled by the others in the same step,
with the same seeds, hence the same completions (`samples_lost` counts what the dead runner took with it).

Async mode: runners never stop generating; each runner's ``sample()`` result is one *chunk* (its prompt groups,
all generated with one weights version: a runner loads new weights between two samples, never during one). The
learner takes whole chunks, oldest first, until it has enough records. The drop rule (`StaleChunkQueue`): a chunk
whose newest policy weights are more than ``max_staleness`` versions behind the learner is dropped whole and
counted, so prompt groups stay whole and the learner never trains on policy samples older than that bound. A chunk
without policy records (behavior models only) is never stale. The prompts of dropped chunks, and of chunks a dead
runner took with it, go back to the schedule and are sampled again first: no prompt of an epoch is skipped.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_p3o.core import metrics
from rllib_p3o.core.columns import Record
from rllib_p3o.core.settings import P3OSettings
from rllib_p3o.core.sources import is_policy
from rllib_p3o.data import sampling_recipes
from rllib_p3o.data.episodes import episodes_to_records
from rllib_p3o.data.prompt_schedule import Group, PromptSchedule
from rllib_p3o.driver.runner_calls import EngineRunners, EnvRunnerFailedError

CompletionRecord = Dict[str, Any]
# RLlib's tag of the runners' in-flight sample() calls.
SAMPLE_TAG = "sample"
# Keys of the sampler's checkpoint state.
SCHEDULE = "schedule"
SAMPLES_LOST_LIFETIME = metrics.SAMPLES_LOST_LIFETIME
DROPPED_STALE_LIFETIME = metrics.DROPPED_STALE_SAMPLES_LIFETIME
GROUPS_FILTERED_LIFETIME = metrics.GROUPS_FILTERED_LIFETIME
# The sampling recipes' declared defaults (`_recipe`).
_RECIPE_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(P3OSettings)
    if f.name in ("dynamic_sampling", "dynamic_sampling_max_rounds", "overlong_buffer", "overlong_penalty")
}
# How long one wait for finished samples lasts before the sampler checks its time limit again (seconds).
_POLL_S = 0.02


def set_staleness(records: Iterable[CompletionRecord], weights_seq_no: int) -> None:
    """Set each record's staleness: ``weights_seq_no - record's weights_seq_no`` for the policy's, -1 for others."""
    for r in records:
        r[Record.STALENESS] = weights_seq_no - r[Record.WEIGHTS_SEQ_NO] if is_policy(r[Record.SOURCE_ID]) else -1


def chunk_staleness(chunk: Iterable[CompletionRecord], weights_seq_no: int, by_oldest: bool = False) -> int:
    """Versions between the learner and the newest policy weights in ``chunk`` (``by_oldest``: the oldest, a
    record's own version being its oldest token's); 0 for a chunk without policy records."""
    versions = [r[Record.WEIGHTS_SEQ_NO] for r in chunk if is_policy(r[Record.SOURCE_ID])]
    if not versions:
        return 0
    return weights_seq_no - (min(versions) if by_oldest else max(versions))


def policy_versions(records: Iterable[CompletionRecord]) -> Set[int]:
    """Every weights version that sampled a token of the policy's ``records`` (each token's, where a record carries
    them; else the record's own)."""
    out: Set[int] = set()
    for r in records:
        if is_policy(r[Record.SOURCE_ID]):
            versions = r.get(Record.POLICY_VERSION)
            out.update(int(v) for v in versions) if versions is not None else out.add(int(r[Record.WEIGHTS_SEQ_NO]))
    return out


class StaleChunkQueue:
    """Chunks of completion records waiting for the learner, oldest first, with the async drop rule (module doc).

    Pure Python: no Ray. ``take`` hands out whole chunks; what it does not need stays queued for the next step (and
    may turn stale there).
    """

    def __init__(self, max_staleness: int, by_oldest: bool = False):
        self.max_staleness, self.by_oldest = max_staleness, by_oldest
        self._chunks: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self._chunks)

    def put(self, chunk: List[CompletionRecord]) -> None:
        self._chunks.append(chunk)

    def take(self, need: int, weights_seq_no: int) -> Tuple[List[CompletionRecord], List[CompletionRecord]]:
        """Whole fresh chunks, oldest first, until at least ``need`` records (or the queue is empty).

        Returns the records taken (their staleness set) and the records dropped as stale on the way.
        """
        taken: List[CompletionRecord] = []
        dropped: List[CompletionRecord] = []
        while self._chunks and len(taken) < need:
            chunk = self._chunks.popleft()
            if chunk_staleness(chunk, weights_seq_no, self.by_oldest) > self.max_staleness:
                dropped += chunk
                continue
            set_staleness(chunk, weights_seq_no)
            taken += chunk
        return taken, dropped


class Sampler:
    """Completion records from the runners for one training step (sync or async, per ``config.async_sampling``).

    Uses the config's ``async_sampling``, ``max_staleness``, ``sample_timeout_s``, ``online_prompts_per_step`` and
    ``group_size``. Runner metrics are aggregated into ``metrics_logger`` under ``env_runners``; the learner's wait
    for data, stale records dropped and samples lost with dead runners are logged under ``p3o``. ``verify(runner id,
    probe result, policy weights versions)`` sees every runner's result before its records are used
    (`rllib_p3o.driver.weight_sync.WeightSync.verify`: it raises for samples of weights that failed, or missed, their probe
    check).
    """

    def __init__(
        self,
        config: AlgorithmConfig,
        runners: EngineRunners,
        metrics_logger: MetricsLogger,
        schedule: PromptSchedule,
        verify: Optional[Callable[[int, Any, Set[int]], None]] = None,
    ):
        self.config = config
        self.verify = verify
        self.runners = runners
        self.metrics = metrics_logger
        self.schedule = schedule
        # In-flight weight updates (`rllib_p3o.runner.inflight`): each runner holds more groups than a sample returns;
        # a chunk is one prompt group, dropped by its oldest token's version.
        self.inflight = bool(getattr(config, "inflight_weight_updates", False))
        self.queue = StaleChunkQueue(config.max_staleness, by_oldest=self.inflight)
        # Async: sample() calls each runner may have running or queued (RLlib's env_runners(
        # max_requests_in_flight_per_env_runner=k)); a runner runs its calls in order, and a weight push queues behind
        # them, so with k calls in flight the learner trains on data about k versions old.
        self.requests_per_runner = max(1, int(getattr(config, "max_requests_in_flight_per_env_runner", 1) or 1))
        self._in_flight: Dict[int, List[List[Group]]] = {}  # async: runner id -> the groups of each call, in order
        self._held: Dict[int, List[Group]] = {}  # in-flight updates: runner id -> every group it holds
        self.dropped_stale_lifetime = 0
        self.samples_lost_lifetime = 0
        self.groups_filtered_lifetime = 0
        self._filtered_now = 0  # groups dynamic sampling left out in the current step

    def sample(self, weights_seq_no: int) -> List[CompletionRecord]:
        """The step's completion records, staleness set: ``online_prompts_per_step`` whole prompt groups in sync
        mode, at least that many completions' worth of whole chunks in async mode."""
        lost_before = self.samples_lost_lifetime
        self._filtered_now = 0
        if self.config.async_sampling:
            records = self._sample_async(self.config.online_prompts_per_step * self.config.group_size, weights_seq_no)
        elif self._recipe("dynamic_sampling"):
            records = self._sample_dynamic(self.config.online_prompts_per_step)
            set_staleness(records, weights_seq_no)
        else:
            records = self._sample_groups(self.schedule.take(self.config.online_prompts_per_step))
            set_staleness(records, weights_seq_no)
        self.schedule.done(r[Record.GROUP_ID] for r in records)
        self._log(metrics.SAMPLES_LOST, self.samples_lost_lifetime - lost_before)
        self._log(metrics.SAMPLES_LOST_LIFETIME, self.samples_lost_lifetime)
        if self._recipe("dynamic_sampling"):
            self.groups_filtered_lifetime += self._filtered_now
            self._log(metrics.GROUPS_FILTERED, self._filtered_now)
            self._log(metrics.GROUPS_FILTERED_LIFETIME, self.groups_filtered_lifetime)
        if self._recipe("overlong_buffer") > 0:
            max_tokens, buffer = self.config.max_tokens, self._recipe("overlong_buffer")
            self._log(metrics.TRUNCATED_SHARE, sampling_recipes.truncated_share(records, max_tokens))
            penalties = [
                self._recipe("overlong_penalty")
                * sampling_recipes.overlong_penalty(sampling_recipes.longest_model_turn(r), max_tokens, buffer)
                for r in records
            ]
            self._log(metrics.OVERLONG_PENALTY_MEAN, sum(penalties) / len(penalties) if penalties else 0.0)
        return records

    def _sample_dynamic(self, want: int) -> List[CompletionRecord]:
        """DAPO's dynamic sampling (sync): ``want`` groups with signal, sampling more groups in the place of those
        without, for at most ``dynamic_sampling_max_rounds`` extra rounds; then groups without signal fill the step
        (oldest first), so that the batch keeps its size. The left-out groups are marked done in the schedule: their
        prompts were drawn, and a restored run continues after them, as the uninterrupted one does."""
        kept: List[CompletionRecord] = []
        filtered: List[CompletionRecord] = []
        rounds = 0
        while True:
            missing = want - len(sampling_recipes.group_ids(kept))
            records = self._sample_groups(self.schedule.take(missing))
            with_signal, without = sampling_recipes.split_by_signal(records)
            kept += with_signal
            filtered += without
            if len(sampling_recipes.group_ids(kept)) >= want or rounds >= self._recipe("dynamic_sampling_max_rounds"):
                break
            rounds += 1
        missing = want - len(sampling_recipes.group_ids(kept))
        fill = set(sampling_recipes.group_ids(filtered)[:missing]) if missing > 0 else set()
        kept += [r for r in filtered if int(r[Record.GROUP_ID]) in fill]
        left_out = [g for g in sampling_recipes.group_ids(filtered) if g not in fill]
        self.schedule.done(left_out)
        self._filtered_now = len(left_out)
        self._log(metrics.EXTRA_SAMPLING_ROUNDS, rounds)
        return kept

    def _sample_groups(self, groups: List[Group]) -> List[CompletionRecord]:
        """Every group sampled once: split over the healthy runners; a dead runner's groups go to the others."""
        records: List[CompletionRecord] = []
        todo = list(groups)
        while todo:
            ids = self.runners.healthy_ids()
            if not ids:
                raise EnvRunnerFailedError(
                    f"no healthy EnvRunner left to sample {len(todo)} prompt groups with "
                    f"(all {self.runners.num_runners()} failed; see the errors above)."
                )
            plan = split_groups(todo, ids)
            results = self.runners.call(
                {i: _sample_call(gs) for i, gs in plan.items()}, timeout_s=self.config.sample_timeout_s
            )
            todo = []
            healthy = set(self.runners.healthy_ids())
            for i, gs in plan.items():
                if i in results:
                    records += self._take_result(i, results[i])
                elif i in healthy:
                    raise RuntimeError(
                        f"EnvRunner {i} did not return its {len(gs)} prompt groups within "
                        f"sample_timeout_s={self.config.sample_timeout_s}."
                    )
                else:  # it died: the others sample its groups, with the same seeds
                    self.samples_lost_lifetime += len(gs) * self.config.group_size
                    todo += gs
        return records

    def _arm(self) -> None:
        """Keep ``requests_per_runner`` sample() calls in flight on every healthy runner, each with its own next prompt
        groups. With in-flight weight updates a runner that holds no groups gets two samples' worth (one to return,
        one to keep generating), then one sample's worth per call."""
        healthy = set(self.runners.healthy_ids())
        for i in [i for i in set(self._in_flight) | set(self._held) if i not in healthy]:  # died: its groups back
            self._lose(i)
        per_runner = math.ceil(self.config.online_prompts_per_step / max(1, self.runners.num_runners()))
        for _ in range(self.requests_per_runner):
            fns = {}
            for i in sorted(i for i in healthy if len(self._in_flight.get(i, [])) < self.requests_per_runner):
                lookahead = per_runner if self.inflight and not self._held.get(i) else 0
                groups = self.schedule.take(per_runner + lookahead)
                self._in_flight.setdefault(i, []).append(groups)
                if self.inflight:
                    self._held.setdefault(i, []).extend(groups)
                fns[i] = _sample_call(groups, per_runner if self.inflight else None)
            self.runners.start(fns, tag=SAMPLE_TAG)

    def _lose(self, runner_id: int) -> None:
        """A runner died or restarted: the groups it held or was sampling go back to the schedule (sampled again
        first) and count as lost."""
        calls = self._in_flight.pop(runner_id, [])
        lost = self._held.pop(runner_id, None) or [g for groups in calls for g in groups]
        if lost:
            self.samples_lost_lifetime += len(lost) * self.config.group_size
            self.schedule.give_back(g.group_id for g in lost)

    def _sample_async(self, need: int, weights_seq_no: int) -> List[CompletionRecord]:
        t0 = time.perf_counter()
        taken: List[CompletionRecord] = []
        dropped = 0
        while True:
            got, stale = self.queue.take(need - len(taken), weights_seq_no)
            if self._recipe("dynamic_sampling"):  # groups without signal are left out; more chunks take their place
                got, without = sampling_recipes.split_by_signal(got)
                left_out = sampling_recipes.group_ids(without)
                self.schedule.done(left_out)
                self._filtered_now += len(left_out)
            taken += got
            dropped += len(stale)
            self.schedule.give_back(r[Record.GROUP_ID] for r in stale)
            if len(taken) >= need:
                break
            self._arm()
            for i, result in self.runners.fetch_ready(SAMPLE_TAG, timeout_s=_POLL_S):
                self._done(i)
                records = self._take_result(i, result)
                if not self.inflight:
                    self.queue.put(records)
                    continue
                returned = {int(r[Record.GROUP_ID]) for r in records}
                self._held[i] = [g for g in self._held.get(i, []) if g.group_id not in returned]
                for group in sampling_recipes.group_ids(records):  # one chunk per group: dropped by its own age
                    self.queue.put([r for r in records if int(r[Record.GROUP_ID]) == group])
            if time.perf_counter() - t0 > self.config.sample_timeout_s:
                raise RuntimeError(
                    f"async sampling produced no usable samples within sample_timeout_s="
                    f"{self.config.sample_timeout_s} (dropped as stale: {dropped})."
                )
        self._arm()
        self.dropped_stale_lifetime += dropped
        self._log(metrics.LEARNER_WAIT_FOR_DATA_S, time.perf_counter() - t0)
        self._log(metrics.DROPPED_STALE_SAMPLES, dropped)
        self._log(metrics.DROPPED_STALE_SAMPLES_LIFETIME, self.dropped_stale_lifetime)
        return taken

    def _take_result(self, runner_id: int, result: tuple) -> List[CompletionRecord]:
        """The records of one runner's sample() result, after its metrics are aggregated and it is verified."""
        episodes, runner_metrics, probe_result = result
        self.metrics.aggregate([runner_metrics], key=ENV_RUNNER_RESULTS)
        records = episodes_to_records(episodes)
        if self._recipe("overlong_buffer") > 0:  # before dynamic sampling and advantages see the rewards
            sampling_recipes.apply_overlong_shaping(
                records, self.config.max_tokens, self._recipe("overlong_buffer"), self._recipe("overlong_penalty")
            )
        if self.verify is not None:
            self.verify(runner_id, probe_result, policy_versions(records))
        return records

    def forget_runners(self, runner_ids: Iterable[int]) -> None:
        """Runners RLlib restarted start with empty engines: the groups their old selves held or were sampling go
        back to the schedule (sampled again first) and count as lost."""
        for i in runner_ids:
            self._lose(i)

    def _done(self, runner_id: int) -> None:
        """A sample() call of this runner came back: its oldest call in flight (a runner runs its calls in order)."""
        calls = self._in_flight.get(runner_id, [])
        if calls:
            calls.pop(0)
        if not calls:
            self._in_flight.pop(runner_id, None)

    def drain(self, timeout_s: float = 60.0) -> int:
        """Wait for the runners' in-flight async samples and discard them with the queue (before the weights are
        replaced by unrelated ones, as in `P3O.reset_config`). Returns how many sample() calls were waited for."""
        waited = sum(len(calls) for calls in self._in_flight.values())
        t0 = time.perf_counter()
        while self._in_flight and time.perf_counter() - t0 < timeout_s:
            for i, _ in self.runners.fetch_ready(SAMPLE_TAG, timeout_s=_POLL_S):
                self._done(i)
            healthy = set(self.runners.healthy_ids())  # a runner that died will not answer
            self._in_flight = {i: g for i, g in self._in_flight.items() if i in healthy}
        self.queue = StaleChunkQueue(self.config.max_staleness, by_oldest=self.inflight)
        if self._held:  # the groups the runners' engines still generate: dropped there, given back here
            self.runners.call({i: _clear_held for i in self._held if i in set(self.runners.healthy_ids())})
            for groups in self._held.values():
                self.schedule.give_back(g.group_id for g in groups)
            self._held = {}
        return waited

    # -- checkpoint: the data position ------------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """The schedule's position; in async mode its pending groups include those in flight or queued now.

        With in-flight weight updates a checkpoint is a synchronization point: the samples in flight or queued and the
        groups the engines hold mid-generation are dropped and given back to the schedule first (`drain`), so that the
        run that goes on and a run restored from the checkpoint both sample them again, from their start, with the
        same weights: the same completions. (A sequence's place in vLLM's sampling stream cannot be saved; without
        the drop, a restored run would continue differently from the run it was saved from.)"""
        if self.inflight:
            self.drain()
        return {
            SCHEDULE: self.schedule.get_state(),
            SAMPLES_LOST_LIFETIME: self.samples_lost_lifetime,
            DROPPED_STALE_LIFETIME: self.dropped_stale_lifetime,
            GROUPS_FILTERED_LIFETIME: self.groups_filtered_lifetime,
        }

    def set_state(self, state: Dict[str, Any]) -> int:
        """Continue from a checkpoint; returns how many groups were pending there (sampled again first). Samples in
        flight or queued now (async) were generated with the weights the restore replaces: they are discarded."""
        self.drain()
        self.schedule.set_state(state[SCHEDULE])
        self.samples_lost_lifetime = int(state.get(SAMPLES_LOST_LIFETIME, 0))
        self.dropped_stale_lifetime = int(state.get(DROPPED_STALE_LIFETIME, 0))
        self.groups_filtered_lifetime = int(state.get(GROUPS_FILTERED_LIFETIME, 0))
        return len(self.schedule.pending)

    def _recipe(self, name: str) -> Any:
        """A sampling-recipe setting of the config (`rllib_p3o.core.settings`); its declared default where the config
        is not a `P3OConfig` (a test's stand-in)."""
        return getattr(self.config, name, _RECIPE_DEFAULTS[name])

    def _log(self, key: str, value: float) -> None:
        self.metrics.log_value((metrics.P3O, key), value, window=1)


def split_groups(groups: List[Group], runner_ids: List[int]) -> Dict[int, List[Group]]:
    """Contiguous, near-equal shares of ``groups`` for the runners (the first ones get one more where it does not
    divide); runners without a share are left out."""
    share, extra = divmod(len(groups), len(runner_ids))
    plan, start = {}, 0
    for k, i in enumerate(runner_ids):
        n = share + (1 if k < extra else 0)
        if n:
            plan[i] = groups[start : start + n]
        start += n
    return plan


def _sample_call(groups: List[Group], return_groups: Optional[int] = None):
    """The runner call for one sample() of these groups (with the runner's metrics since its last one, and the
    weight-sync probe its engine scored on the way, if any); with in-flight weight updates, ``return_groups`` of the
    groups it holds come back."""
    groups = [tuple(g) for g in groups]
    if return_groups is None:
        return lambda runner: (runner.sample(groups=groups), runner.get_metrics(), runner.take_probe_result())
    return lambda runner: (
        runner.sample(groups=groups, return_groups=return_groups),
        runner.get_metrics(),
        runner.take_probe_result(),
    )


def _clear_held(runner: Any) -> int:
    """The runner call that drops the prompt groups its in-flight engine holds (their weights are being replaced)."""
    return runner.clear_held_groups()
