"""Weight sync, the driver's side: the learner's weights into the runners' vLLM engines, in place, checked on a probe.

One push (`WeightSync`) carries the next weights version (``weights_seq_no``) and the learner's module state (put
into Ray's object store once, shared by all runners), in the format of `rllib_p3o.sync.payload`. Each runner
(`VLLMEnvRunner.load_policy_weights`) reloads its engine with it. With ``verify_weight_sync`` the engine's log-probs
of a fixed probe sequence are compared with the learner's (`rllib_p3o.sync.probe`): at load, where the weights must
be verified before anything else runs (`WeightSync.push_verified`, `WeightSync.push_to`), or riding along with the
runner's next generate call (`WeightSync.push`, every iteration; the driver checks the result with
`WeightSync.check` before it uses the samples). A failed check raises `WeightSyncError`: a silent sync failure would
otherwise look like staleness.

The rule for callers: the learner's probe of the weights last pushed is scored in a background thread, so call
`WeightSync.settle` before anything changes or reads the learner's weights (an update, a checkpoint, an export).
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import numpy as np
import ray
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup

from rllib_p3o.core import metrics
from rllib_p3o.core.precision import RolloutWeights
from rllib_p3o.driver.runner_calls import EngineRunners
from rllib_p3o.sync.payload import (
    DEFAULT_TOLERANCE,
    PROBE,
    PROBE_LOGPROBS,
    PROBE_TOKEN_IDS,
    RL_MODULE,
    RTOL,
    TOLERANCE,
    VERSION,
    PackedTensors,
)
from rllib_p3o.sync.probe import ProbeResult, WeightSyncError, check_not_diverged, check_probe

# RLlib's tag of the non-blocking pushes (async mode).
SYNC_TAG = "sync"


def _torch_single_threaded() -> None:
    """Run this (background) thread's torch ops on one OpenMP thread: ``torch.set_num_threads`` called here sets the
    calling thread's OpenMP thread count only.

    Why: with libgomp, torch ops on a second thread get an OpenMP team of their own, of the default size. Once a
    process holds more OpenMP threads than cores, libgomp stops spin-waiting between parallel regions (its throttled
    spin count) and each region of the learner's update pays a sleep and a wake-up: with the probe thread's default
    team, a small model's 2-thread forward+backward runs about a third slower.
    """
    import torch

    torch.set_num_threads(1)


class LearnerProbes:
    """The driver's side of riding-along checks: the learner's probe log-probs for each weights version, scored in a
    background thread, and the comparison with what the runners return.

    ``score()`` returns the learner's probe log-probs with its current weights; a diverged policy is reported as such
    (`rllib_p3o.sync.probe.check_not_diverged`) before any comparison with an engine. `start` must be called right
    after a version's weights are gathered, and `settle` before the learner's weights change again (the next update) or the
    learner is used otherwise (checkpoints, export). The newest ``keep`` versions are kept: async samples may come
    back with older weights than the learner's, up to ``max_staleness`` versions.

    ``background=False`` scores in `start` itself, on the caller's thread: for scoring that swaps the module's
    weights while it runs (the rollout precision's `rollout_logprobs`), which nothing else may see.
    """

    def __init__(
        self, score: Callable[[], List[float]], tolerance: float, keep: int, rtol: float = 0.0, background: bool = True
    ):
        self._score = score
        self.background = background
        self.tolerance = tolerance
        self.rtol = rtol
        self.keep = max(2, int(keep))
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="p3o-learner-probe", initializer=_torch_single_threaded
        )
        self._versions: "collections.OrderedDict[int, Future]" = collections.OrderedDict()
        # The newest version each runner has been verified with (at load, or by a returned probe).
        self.verified: Dict[int, int] = {}
        self.last_stats: Dict[str, float] = {}

    def start(self, weights_seq_no: int) -> None:
        """Score the probe with the learner's current weights as ``weights_seq_no``, in the background (or now)."""
        if self.background:
            self._versions[weights_seq_no] = self._pool.submit(self._timed_score, weights_seq_no)
        else:
            self._versions[weights_seq_no] = done = Future()
            try:
                done.set_result(self._timed_score(weights_seq_no))
            except Exception as e:  # raised where the result is read, as from the background thread
                done.set_exception(e)
        while len(self._versions) > self.keep:
            self._versions.popitem(last=False)

    def logprobs(self, weights_seq_no: int) -> Optional[List[float]]:
        """The learner's probe log-probs of that version (waits for them), or None if it is no longer kept."""
        future = self._versions.get(weights_seq_no)
        return future.result()[0] if future is not None else None

    def settle(self) -> None:
        """Wait for the scoring in flight (raises what it raised)."""
        for future in self._versions.values():
            future.result()

    def close(self) -> None:
        """Wait for the scoring in flight, then stop the thread."""
        self._pool.shutdown(wait=True)

    def forget(self) -> None:
        """Wait for the scoring in flight, then drop every version's log-probs and the runners' verified versions
        (after a restore, version numbers start again from the restored iteration's)."""
        self.settle()
        self._versions.clear()
        self.verified.clear()

    def check(self, result: ProbeResult) -> Optional[float]:
        """Compare a runner's probe result with the learner's log-probs of the same version; raises
        `WeightSyncError` on a mismatch. Returns the max |difference|, or None for a version no longer kept (its
        samples are too stale to be used)."""
        future = self._versions.get(result.weights_seq_no)
        if future is None:
            return None
        learner_logprobs, learner_s = future.result()
        diff = check_probe(
            result.logprobs,
            learner_logprobs,
            self.tolerance,
            where=f"EnvRunner {result.runner_id}: with weights v{result.weights_seq_no}",
            rtol=self.rtol,
        )
        self.mark_verified(result.runner_id, result.weights_seq_no)
        self.last_stats = {metrics.PROBE_MAX_ABS_DIFF: diff, metrics.PROBE_LEARNER_S: learner_s}
        return diff

    def checked_at_load(
        self, runner_ids: List[int], weights_seq_no: int, max_abs_diff: Optional[float], learner_s: float
    ) -> None:
        """Record checks the runners did at load (they raise on a mismatch): they are verified with that version,
        and their worst difference is the latest check's until one rides along."""
        for runner_id in runner_ids:
            self.mark_verified(runner_id, weights_seq_no)
        if max_abs_diff is not None:
            self.last_stats = {metrics.PROBE_MAX_ABS_DIFF: max_abs_diff, metrics.PROBE_LEARNER_S: learner_s}

    def mark_verified(self, runner_id: int, weights_seq_no: int) -> None:
        self.verified[runner_id] = max(self.verified.get(runner_id, 0), weights_seq_no)

    def require_verified(self, runner_id: int, weights_seq_no: int) -> None:
        """Raise unless ``runner_id`` has been verified with weights ``weights_seq_no`` (or newer)."""
        if self._versions and weights_seq_no < next(iter(self._versions)):
            return  # older than any kept version: too stale to be used (the sampler drops it)
        if self.verified.get(runner_id, 0) < weights_seq_no:
            raise WeightSyncError(
                f"EnvRunner {runner_id} returned samples of weights v{weights_seq_no} without a "
                f"probe check of them (verified up to v{self.verified.get(runner_id, 0)})."
            )

    def _timed_score(self, weights_seq_no: int) -> tuple:
        t0 = time.perf_counter()
        logprobs = self._score()
        check_not_diverged(logprobs, where=f"weights v{weights_seq_no}")
        return logprobs, time.perf_counter() - t0


class WeightSync:
    """The driver's side: counts weights versions and pushes each new version to every engine runner.

    Blocking pushes wait (at most ``timeout_s``) for every healthy runner and return the worst (max) of their load
    statistics; a runner that does not answer in time raises `WeightSyncError` naming it, never a silent hang. A
    runner that dies during a push is left out: RLlib restarts it and `push_to` loads it before it samples again.
    Non-blocking pushes (async sampling with remote runners) do not wait: each runner loads the weights after its
    current sample() (Ray actors are serial); the statistics returned are those of the latest push that has come
    back, and errors of earlier pushes are raised when their results come back.

    Probe checks (with ``probe_token_ids``; `rllib_p3o.sync.probe`): `push` has the runners score the probe with their next
    generate call, and the driver checks what they return (`check`, `require_verified`) while the learner's side is
    scored in the background; `push_verified` and `push_to` check at load. Call `settle` before the learner's
    weights change or the learner is used otherwise.
    """

    def __init__(
        self,
        learner_group: LearnerGroup,
        runners: EngineRunners,
        *,
        probe_token_ids: Optional[List[int]],
        tolerance: float = DEFAULT_TOLERANCE,
        rtol: float = 0.0,
        rollout_weights: Optional[RolloutWeights] = None,
        push_async: bool = False,
        timeout_s: Optional[float] = None,
        max_staleness: int = 0,
    ):
        self.learner_group = learner_group
        self.runners = runners
        self.probe_token_ids = probe_token_ids
        self.tolerance = tolerance
        # How the engines hold the weights, when that differs from the learner's (None: sent as they are).
        self.rollout_weights = rollout_weights
        self.push_async = push_async
        self.timeout_s = timeout_s
        # The version of the weights the runners hold (or are loading); 0 before the first push.
        self.weights_seq_no = 0
        self._last_stats: Dict[str, float] = {}
        # Non-blocking pushes not yet come back, per runner (`_collect_pushes`).
        self._pushes_in_flight: Dict[int, int] = {}
        # The driver's part of the latest push (`rllib_p3o.core.metrics`: gather, learner probe, bytes).
        self.driver_stats: Dict[str, float] = {}
        self.probes = (
            # Scoring the probe as the engines hold the weights swaps the module's weights while it runs: not in the
            # background, where the driver could read the module meanwhile.
            LearnerProbes(
                self._learner_probe, tolerance, keep=max_staleness + 2, rtol=rtol, background=rollout_weights is None
            )
            if probe_token_ids is not None
            else None
        )

    def push(self, blocking: Optional[bool] = None) -> Dict[str, float]:
        """Push the learner's current weights as the next version, to be checked with the runners' next generate
        call; returns the runners' load statistics and the latest probe check's."""
        self.weights_seq_no += 1
        if blocking is None:
            blocking = not self.push_async
        checked = self.probes.last_stats if self.probes is not None else {}
        if not blocking:
            payload = self._payload(check_at_load=False)
            ids = self.runners.healthy_ids()
            self._collect_pushes(wait_for=ids)
            self.runners.start({i: lambda r: r.load_policy_weights(payload) for i in ids}, tag=SYNC_TAG)
            for i in ids:
                self._pushes_in_flight[i] = self._pushes_in_flight.get(i, 0) + 1
            stats = {**self._last_stats, **self.driver_stats}
        else:
            stats = self._push_to(self.runners.healthy_ids(), check_at_load=False)
        stats.update(checked)
        if self.probes is not None:
            # After the loads it waited for (a blocking push), so that the learner's probe does not compete with the
            # engines' reload for the cores; it overlaps the next generation instead.
            self.probes.start(self.weights_seq_no)
        return stats

    def _collect_pushes(self, wait_for: Iterable[int] = ()) -> None:
        """Take the results of the non-blocking pushes that came back; for each runner of ``wait_for`` that has as
        many pushes in flight as RLlib lets it have (``max_requests_in_flight_per_env_runner`` per tag), wait for
        its oldest. RLlib would skip a new call to such a runner rather than queue it: a skipped push would leave the
        runner on older weights for as long as chance decides, so which weights sample what would depend on timing.
        The wait is short: the sampler arms a runner's next sample() before the learner updates, so the runner's
        oldest push is next in its queue, behind samples the driver has already taken."""
        limit = self.runners.max_in_flight()
        deadline = time.perf_counter() + (self.timeout_s or 600.0)
        while True:
            for i, stats in self.runners.fetch_ready(SYNC_TAG, timeout_s=0.0):
                self._last_stats = stats
                self._pushes_in_flight[i] = max(0, self._pushes_in_flight.get(i, 0) - 1)
            healthy = set(self.runners.healthy_ids())
            self._pushes_in_flight = {i: n for i, n in self._pushes_in_flight.items() if i in healthy and n > 0}
            full = [i for i in wait_for if self._pushes_in_flight.get(i, 0) >= limit]
            if not full:
                return
            if time.perf_counter() > deadline:
                raise WeightSyncError(
                    f"EnvRunner {', '.join(map(str, full))} did not finish loading weights within "
                    f"weight_sync_timeout_s={self.timeout_s} s."
                )
            time.sleep(0.005)

    def push_verified(self) -> Dict[str, float]:
        """Push the learner's current weights as the next version to every runner, checked at load, and wait."""
        self.weights_seq_no += 1
        return self.push_to(self.runners.healthy_ids())

    def push_to(self, runner_ids: List[int]) -> Dict[str, float]:
        """Load the learner's current weights, as the current version, into these runners, check them at load and
        wait (e.g. runners RLlib has just restarted: they must hold the current weights, verified, before they
        sample)."""
        return self._push_to(runner_ids, check_at_load=True)

    def push_restored(self, iteration: int) -> Dict[str, float]:
        """After a checkpoint restore: push the restored weights as the version an uninterrupted run holds after
        ``iteration`` iterations, ``iteration + 1`` (the initial weights are v1; each iteration's push adds one), and
        wait. So a restored run records the same ``policy_version`` per iteration as the uninterrupted one.

        Probe results of the versions held before the restore are forgotten: their numbers may now name other
        weights. RLlib's own post-restore sync is fire-and-forget; the restored weights must be in the engines (and
        verified) before sampling goes on.
        """
        if self.probes is not None:
            self.probes.forget()
        self.weights_seq_no = iteration
        return self.push_verified()

    def check(self, result: Optional[ProbeResult]) -> None:
        """Check a probe result a runner returned with its samples or evaluation (raises `WeightSyncError`)."""
        if result is not None and self.probes is not None:
            self.probes.check(result)

    def verify(self, runner_id: int, result: Optional[ProbeResult], weights_versions: Iterable[int]) -> None:
        """Check what a runner returned with its samples: its probe result, if any, then that it has passed a probe
        check with each policy weights version its samples were generated with (raises `WeightSyncError`)."""
        self.check(result)
        if self.probes is not None:
            for version in set(weights_versions):
                self.probes.require_verified(runner_id, version)

    def settle(self) -> None:
        """Wait for the learner's probe scoring in flight: the learner's weights may change after this."""
        if self.probes is not None:
            self.probes.settle()

    def close(self) -> None:
        """Settle, and stop the learner probe's thread (this object is not used afterwards)."""
        if self.probes is not None:
            self.probes.close()

    def _push_to(self, runner_ids: List[int], check_at_load: bool) -> Dict[str, float]:
        if not runner_ids:
            return {}
        payload = self._payload(check_at_load)
        results = self.runners.call(
            {i: lambda r: r.load_policy_weights(payload) for i in runner_ids}, timeout_s=self.timeout_s
        )
        hung = sorted((set(runner_ids) - set(results)) & set(self.runners.healthy_ids()))
        if hung:
            raise WeightSyncError(
                f"EnvRunner {', '.join(map(str, hung))} did not finish loading weights v{self.weights_seq_no} within "
                f"weight_sync_timeout_s={self.timeout_s} s."
            )
        stats = [r for r in results.values() if r]
        worst = {k: float(np.max([r[k] for r in stats])) for k in stats[0]} if stats else {}
        if check_at_load and self.probes is not None:
            self.probes.checked_at_load(
                list(results),
                self.weights_seq_no,
                worst.get(metrics.PROBE_MAX_ABS_DIFF),
                self.driver_stats[metrics.PROBE_LEARNER_S],
            )
        return {**worst, **self.driver_stats}

    def _payload(self, check_at_load: bool) -> Dict[str, Any]:
        """The next version's payload; its driver-side time split goes to `driver_stats`. With ``check_at_load`` the
        learner's probe is scored before the payload leaves (else `push` has it scored in the background)."""
        t0 = time.perf_counter()
        state = self.learner_group.get_state(
            components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE, inference_only=True
        )[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
        state = state.get(DEFAULT_MODULE_ID, state)
        if self.rollout_weights is not None:  # as the engines hold them: cast (and FP8-rounded if simulated)
            state = self.rollout_weights.apply(state)
        payload: Dict[str, Any] = {RL_MODULE: ray.put(PackedTensors(state)), VERSION: self.weights_seq_no}
        t1 = time.perf_counter()
        self.driver_stats = {metrics.GATHER_S: t1 - t0, metrics.SYNC_BYTES: float(_num_bytes(state))}
        if self.probes is not None:
            payload[PROBE] = {PROBE_TOKEN_IDS: self.probe_token_ids}
            if check_at_load:
                self.probes.start(self.weights_seq_no)
                payload[PROBE][PROBE_LOGPROBS] = self.probes.logprobs(self.weights_seq_no)
                payload[TOLERANCE] = self.tolerance
                payload[RTOL] = self.probes.rtol
                self.driver_stats[metrics.PROBE_LEARNER_S] = time.perf_counter() - t1
        return payload

    def _learner_probe(self) -> List[float]:
        """The learner's log-probs of the probe with its current weights (the first learner's: they all agree)."""
        probe_ids = self.probe_token_ids  # a local: the lambda must not capture self (it is shipped to learners)
        results = self.learner_group.foreach_learner(
            lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().rollout_logprobs(probe_ids)
        )
        return [r.get() for r in results][0]


def _num_bytes(state: Mapping[str, Any]) -> int:
    """Bytes of the tensors of a (possibly nested) module state."""
    return sum(
        _num_bytes(v) if isinstance(v, Mapping) else int(v.numel() * v.element_size())
        for v in state.values()
        if isinstance(v, Mapping) or hasattr(v, "element_size")
    )
