"""Weight sync: the learner's weights into the runners' vLLM engines, in place, checked on a probe sequence.

One push (driver side, `WeightSync.push`) carries the next weights version (``weights_seq_no``), the learner's
module state (put into Ray's object store once, shared by all runners) and, with ``verify_weight_sync``, the
learner's log-probs of a fixed probe sequence. Each runner (`VLLMEnvRunner.load_policy_weights`) reloads its engine
with `hf_weights` of that state, scores the same probe and raises `WeightSyncError` through `check_probe` when any
log-prob differs by more than the tolerance: a silent sync failure would otherwise look like staleness.

The payload, a dict:
    rl_module       the learner's module state, ``{"default_policy": {"lm.<HF name>": tensor}}`` or its inner dict,
                    or an ObjectRef to either
    weights_seq_no  the weights version being loaded
    probe           optional: ``{"token_ids": [int, ...], "logprobs": [float, ...]}``, the learner's log-prob of
                    each probe token after the first
    tolerance       largest allowed |learner - engine| log-prob on the probe
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import ray

from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rllib_p3o.engine_runners import EngineRunners

# Payload keys (see the module docstring); the first two are RLlib's own names for a runner's state.
RL_MODULE = COMPONENT_RL_MODULE
VERSION = WEIGHTS_SEQ_NO
PROBE = "probe"
PROBE_TOKEN_IDS = "token_ids"
PROBE_LOGPROBS = "logprobs"
TOLERANCE = "tolerance"
DEFAULT_TOLERANCE = 1e-3

# `HFCausalLMRLModule` holds the Hugging Face model as ``self.lm``: its state names are "lm." + the HF names.
LM_PREFIX = "lm."
# RLlib's tag of the non-blocking pushes (async mode).
SYNC_TAG = "sync"


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights the learner sent (a silent sync failure would look like staleness)."""


def hf_weights(module_state: Mapping[str, Any], tied_embeddings: bool) -> Dict[str, Any]:
    """The learner module's weights under Hugging Face checkpoint names (what vLLM's reload expects)."""
    state = module_state.get(DEFAULT_MODULE_ID, module_state)
    hf = {k[len(LM_PREFIX):]: v.contiguous() for k, v in state.items() if k.startswith(LM_PREFIX)}
    if not hf:
        raise WeightSyncError(f"weight payload has no '{LM_PREFIX}*' tensors (keys: {list(state)[:5]})")
    if tied_embeddings:
        hf.pop("lm_head.weight", None)  # shares storage with the embedding; vLLM re-ties it
    return hf


def check_probe(engine_logprobs: np.ndarray, learner_logprobs: Sequence[float], tolerance: float, where: str) -> float:
    """``max |engine - learner|`` over the probe's log-probs; raises `WeightSyncError` above ``tolerance`` (or NaN).

    ``where`` opens the error message (e.g. "runner 1: after loading weights v7").
    """
    diff = float(np.max(np.abs(engine_logprobs - np.asarray(learner_logprobs, dtype=np.float64))))
    if not diff <= tolerance:
        raise WeightSyncError(
            f"{where} the engine's log-probs differ from the learner's by up to {diff:.3g} (tolerance {tolerance}); "
            f"the engine does not hold the learner's weights.")
    return diff


class WeightSync:
    """The driver's side: counts weights versions and pushes each new version to every engine runner.

    Blocking pushes wait (at most ``timeout_s``) for every healthy runner and return the worst (max) of their load
    statistics; a runner that does not answer in time raises `WeightSyncError` naming it, never a silent hang. A
    runner that dies during a push is left out: RLlib restarts it and `push_to` loads it before it samples again.
    Non-blocking pushes (async sampling with remote runners) do not wait: each runner loads the weights after its
    current sample() (Ray actors are serial); the statistics returned are those of the latest push that has come
    back, and errors of earlier pushes (a failed probe check) are raised when their results come back.
    """

    def __init__(self, learner_group: LearnerGroup, runners: EngineRunners, *,
                 probe_token_ids: Optional[List[int]], tolerance: float = DEFAULT_TOLERANCE,
                 push_async: bool = False, timeout_s: Optional[float] = None):
        self.learner_group = learner_group
        self.runners = runners
        self.probe_token_ids = probe_token_ids
        self.tolerance = tolerance
        self.push_async = push_async
        self.timeout_s = timeout_s
        # The version of the weights the runners hold (or are loading); 0 before the first push.
        self.weights_seq_no = 0
        self._last_stats: Dict[str, float] = {}

    def push(self, blocking: Optional[bool] = None) -> Dict[str, float]:
        """Push the learner's current weights as the next version; returns the runners' load statistics."""
        self.weights_seq_no += 1
        if blocking is None:
            blocking = not self.push_async
        if not blocking:
            payload = self._payload()
            for _, stats in self.runners.fetch_ready(SYNC_TAG, timeout_s=0.0):
                self._last_stats = stats
            self.runners.start({i: lambda r: r.load_policy_weights(payload) for i in self.runners.healthy_ids()},
                               tag=SYNC_TAG)
            return dict(self._last_stats)
        return self.push_to(self.runners.healthy_ids())

    def push_to(self, runner_ids: List[int]) -> Dict[str, float]:
        """Load the learner's current weights, as the current version, into these runners and wait for them (e.g.
        runners RLlib has just restarted: they must hold the current weights, verified, before they sample)."""
        if not runner_ids:
            return {}
        payload = self._payload()
        results = self.runners.call({i: lambda r: r.load_policy_weights(payload) for i in runner_ids},
                                    timeout_s=self.timeout_s)
        hung = sorted((set(runner_ids) - set(results)) & set(self.runners.healthy_ids()))
        if hung:
            raise WeightSyncError(
                f"EnvRunner {', '.join(map(str, hung))} did not finish loading weights v{self.weights_seq_no} within "
                f"weight_sync_timeout_s={self.timeout_s} s.")
        stats = [r for r in results.values() if r]
        return {k: float(np.max([r[k] for r in stats])) for k in stats[0]} if stats else {}

    def push_restored(self, iteration: int) -> Dict[str, float]:
        """After a checkpoint restore: continue the version count past the restored iterations, push and wait.

        RLlib's own post-restore sync is fire-and-forget; the restored weights must be in the engines (and verified)
        before sampling goes on.
        """
        self.weights_seq_no = max(self.weights_seq_no, iteration + 1)
        return self.push(blocking=True)

    def _payload(self) -> Dict[str, Any]:
        state = self.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                             inference_only=True)[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
        payload: Dict[str, Any] = {RL_MODULE: ray.put(state), VERSION: self.weights_seq_no}
        if self.probe_token_ids is not None:
            probe_ids = self.probe_token_ids  # a local: the lambda must not capture self (it is shipped to learners)
            results = self.learner_group.foreach_learner(
                lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().sequence_logprobs(probe_ids))
            payload[PROBE] = {PROBE_TOKEN_IDS: probe_ids, PROBE_LOGPROBS: [r.get() for r in results][0]}
            payload[TOLERANCE] = self.tolerance
        return payload
