"""Weight-sync verification: the engine's log-probs of a fixed probe sequence must match the learner's.

A sync (`rllib_p3o.weight_sync`) is checked in one of two ways:
- **at load**: the payload carries the learner's probe log-probs and the runner scores the probe in a call of its own
  right after loading. Used where the weights must be verified before anything else runs: a trial's first sync, a
  restored checkpoint, a restarted runner.
- **riding along** (every training iteration): at load the runner arms its `ProbeRider`, and the probe joins the next
  batch the policy engine generates (a sample() or a held-out evaluation) as one more request. That costs the engine
  a few prompt tokens in a batch it runs anyway, instead of a call of its own. The runner returns the engine's probe
  log-probs (a `ProbeResult`) with those results, and the driver compares them (`LearnerProbes.check`) before it
  uses them: no sample generated with unverified weights reaches the learner, and a failed check raises
  `WeightSyncError` naming the runner and the version. The learner's side is scored in a background thread
  (`LearnerProbes.start`) while the runners load and generate.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from rllib_p3o import metrics


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights the learner sent (a silent sync failure would look like staleness)."""


def check_probe(engine_logprobs: np.ndarray, learner_logprobs: Sequence[float], tolerance: float, where: str) -> float:
    """``max |engine - learner|`` over the probe's log-probs; raises `WeightSyncError` above ``tolerance`` (or NaN).

    ``where`` opens the error message (e.g. "runner 1: after loading weights v7").
    """
    diff = float(np.max(np.abs(np.asarray(engine_logprobs, dtype=np.float64)
                                - np.asarray(learner_logprobs, dtype=np.float64))))
    if not diff <= tolerance:
        raise WeightSyncError(
            f"{where} the engine's log-probs differ from the learner's by up to {diff:.3g} (tolerance {tolerance}); "
            f"the engine does not hold the learner's weights.")
    return diff


class ProbeResult(NamedTuple):
    """The engine's probe log-probs with one weights version, as a runner returns them."""

    runner_id: int
    weights_seq_no: int
    logprobs: List[float]


class ProbeRider:
    """A runner's policy engine (``vllm.LLM``), whose next ``generate`` call, once armed, also scores the probe.

    The probe is one more request (``prompt_logprobs``, one generated token) in that call; the caller gets its own
    outputs only, in its own order. Everything else is the engine's (attribute access is passed through).
    """

    def __init__(self, llm: Any, runner_id: int):
        self.llm = llm
        self.runner_id = runner_id
        self._armed: Optional[tuple] = None  # (weights version, probe token ids)
        self._result: Optional[ProbeResult] = None

    def arm(self, weights_seq_no: int, token_ids: Sequence[int]) -> None:
        """Score ``token_ids`` in the next generate call (a newer version replaces an armed, unscored one)."""
        self._armed = (int(weights_seq_no), list(token_ids))
        self._result = None

    def take_result(self) -> Optional[ProbeResult]:
        """The probe scored since the last call, if any (each result is handed out once)."""
        result, self._result = self._result, None
        return result

    def generate(self, prompts: Sequence[Any], sampling_params: Any = None, **kwargs: Any) -> List[Any]:
        if self._armed is None:
            return self.llm.generate(prompts, sampling_params, **kwargs)
        from rllib_p3o.vllm_engine import probe_logprobs, probe_request

        version, token_ids = self._armed
        prompts = list(prompts)
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        probe_prompt, probe_params = probe_request(token_ids)
        if isinstance(kwargs.get("lora_request"), (list, tuple)):  # per request: the probe uses the policy's adapter
            kwargs["lora_request"] = list(kwargs["lora_request"]) + [kwargs["lora_request"][0]]
        outputs = self.llm.generate(prompts + [probe_prompt], params + [probe_params], **kwargs)
        self._armed = None
        self._result = ProbeResult(self.runner_id, version, probe_logprobs(token_ids, outputs[-1]).tolist())
        return outputs[:-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)


def _torch_single_threaded() -> None:
    """Run this (background) thread's torch ops on one OpenMP thread: ``torch.set_num_threads`` called here sets the
    calling thread's OpenMP thread count only.

    Why: with libgomp, torch ops on a second thread get an OpenMP team of their own, of the default size. Once a
    process holds more OpenMP threads than cores, libgomp stops spin-waiting between parallel regions (its throttled
    spin count) and each region of the learner's update pays a sleep and a wake-up: with the probe thread's default
    team, a 2-thread forward+backward at 2.44M parameters took 0.164 s instead of 0.123 s.
    """
    import torch

    torch.set_num_threads(1)


class LearnerProbes:
    """The driver's side of riding-along checks: the learner's probe log-probs for each weights version, scored in a
    background thread, and the comparison with what the runners return.

    ``score()`` returns the learner's probe log-probs with its current weights; `start` must be called right after a
    version's weights are gathered, and `settle` before the learner's weights change again (the next update) or the
    learner is used otherwise (checkpoints, export). The newest ``keep`` versions are kept: async samples may come
    back with older weights than the learner's, up to ``max_staleness`` versions.
    """

    def __init__(self, score: Callable[[], List[float]], tolerance: float, keep: int):
        self._score = score
        self.tolerance = tolerance
        self.keep = max(2, int(keep))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="p3o-learner-probe",
                                        initializer=_torch_single_threaded)
        self._versions: "collections.OrderedDict[int, Future]" = collections.OrderedDict()
        # The newest version each runner has been verified with (at load, or by a returned probe).
        self.verified: Dict[int, int] = {}
        self.last_stats: Dict[str, float] = {}

    def start(self, weights_seq_no: int) -> None:
        """Score the probe with the learner's current weights as ``weights_seq_no``, in the background."""
        self._versions[weights_seq_no] = self._pool.submit(self._timed_score)
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

    def check(self, result: ProbeResult) -> Optional[float]:
        """Compare a runner's probe result with the learner's log-probs of the same version; raises
        `WeightSyncError` on a mismatch. Returns the max |difference|, or None for a version no longer kept (its
        samples are too stale to be used)."""
        future = self._versions.get(result.weights_seq_no)
        if future is None:
            return None
        learner_logprobs, learner_s = future.result()
        diff = check_probe(result.logprobs, learner_logprobs, self.tolerance,
                           where=f"EnvRunner {result.runner_id}: with weights v{result.weights_seq_no}")
        self.mark_verified(result.runner_id, result.weights_seq_no)
        self.last_stats = {metrics.PROBE_MAX_ABS_DIFF: diff, metrics.PROBE_LEARNER_S: learner_s}
        return diff

    def checked_at_load(self, runner_ids: List[int], weights_seq_no: int, max_abs_diff: Optional[float],
                        learner_s: float) -> None:
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
            raise WeightSyncError(f"EnvRunner {runner_id} returned samples of weights v{weights_seq_no} without a "
                                  f"probe check of them (verified up to v{self.verified.get(runner_id, 0)}).")

    def _timed_score(self) -> tuple:
        t0 = time.perf_counter()
        return self._score(), time.perf_counter() - t0
