"""Weight sync: the learner's weights into the runners' vLLM engines, in place, checked on a probe sequence.

One push (driver side, `WeightSync.push`) carries the next weights version (``weights_seq_no``), the learner's
module state (put into Ray's object store once, shared by all runners) and, with ``verify_weight_sync``, the
learner's log-probs of a fixed probe sequence. Each runner (`VLLMEnvRunner.load_policy_weights`) reloads its engine
with `hf_weights` of that state, scores the same probe and raises `WeightSyncError` through `check_probe` when any
log-prob differs by more than the tolerance: a silent sync failure would otherwise look like staleness.

The payload, a dict:
    rl_module       the learner's module state, ``{"default_policy": {"lm.<HF name>": tensor}}`` or its inner dict
                    (or a `PackedTensors` of it), or an ObjectRef to any of these
    weights_seq_no  the weights version being loaded
    probe           optional: ``{"token_ids": [int, ...], "logprobs": [float, ...]}``, the learner's log-prob of
                    each probe token after the first
    tolerance       largest allowed |learner - engine| log-prob on the probe
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import time
import warnings

import numpy as np
import ray
import torch

from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rllib_p3o import metrics
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


class PackedTensors:
    """A module state's tensors as flat byte arrays, for the object store.

    Ray pickles torch tensors through ``torch.save`` (about 4 ms per MB here), but ships numpy arrays out of band: one
    copy into the object store, zero-copy reads in every runner. Any dtype (bfloat16 included, which numpy lacks)
    travels as its raw bytes and is viewed back as the same dtype and shape; the receiving engine copies the values
    into its own parameters, so the read-only views are never written.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self.specs = {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()}
        self.arrays = {k: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                       for k, t in tensors.items()}

    def unpack(self) -> Dict[str, torch.Tensor]:
        with warnings.catch_warnings():  # torch warns that the object store's buffers are read-only
            warnings.simplefilter("ignore", UserWarning)
            return {k: torch.from_numpy(a).view(self.specs[k][0]).reshape(self.specs[k][1])
                    for k, a in self.arrays.items()}


def module_tensors(module_state: Union[Mapping[str, Any], PackedTensors]) -> Mapping[str, Any]:
    """``{module state name: tensor}`` of a payload's module state (packed or not, nested under the module id or
    not)."""
    state = module_state.unpack() if isinstance(module_state, PackedTensors) else module_state
    return state.get(DEFAULT_MODULE_ID, state)


def hf_weights(module_state: Union[Mapping[str, Any], PackedTensors], tied_embeddings: bool) -> Dict[str, Any]:
    """The learner module's weights under Hugging Face checkpoint names (what vLLM's reload expects)."""
    state = module_tensors(module_state)
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
        # The driver's part of the latest push (`rllib_p3o.metrics`: gather, learner probe, bytes).
        self.driver_stats: Dict[str, float] = {}

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
            return {**self._last_stats, **self.driver_stats}
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
        worst = {k: float(np.max([r[k] for r in stats])) for k in stats[0]} if stats else {}
        return {**worst, **self.driver_stats}

    def push_restored(self, iteration: int) -> Dict[str, float]:
        """After a checkpoint restore: continue the version count past the restored iterations, push and wait.

        RLlib's own post-restore sync is fire-and-forget; the restored weights must be in the engines (and verified)
        before sampling goes on.
        """
        self.weights_seq_no = max(self.weights_seq_no, iteration + 1)
        return self.push(blocking=True)

    def _payload(self) -> Dict[str, Any]:
        """The next version's payload; its driver-side time split goes to `driver_stats`."""
        t0 = time.perf_counter()
        state = self.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                             inference_only=True)[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
        state = state.get(DEFAULT_MODULE_ID, state)
        payload: Dict[str, Any] = {RL_MODULE: ray.put(PackedTensors(state)), VERSION: self.weights_seq_no}
        t1 = time.perf_counter()
        self.driver_stats = {metrics.GATHER_S: t1 - t0, metrics.SYNC_BYTES: float(_num_bytes(state))}
        if self.probe_token_ids is not None:
            probe_ids = self.probe_token_ids  # a local: the lambda must not capture self (it is shipped to learners)
            results = self.learner_group.foreach_learner(
                lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().sequence_logprobs(probe_ids))
            payload[PROBE] = {PROBE_TOKEN_IDS: probe_ids, PROBE_LOGPROBS: [r.get() for r in results][0]}
            payload[TOLERANCE] = self.tolerance
            self.driver_stats[metrics.PROBE_LEARNER_S] = time.perf_counter() - t1
        return payload


def _num_bytes(state: Mapping[str, Any]) -> int:
    """Bytes of the tensors of a (possibly nested) module state."""
    return sum(_num_bytes(v) if isinstance(v, Mapping) else int(v.numel() * v.element_size())
               for v in state.values() if isinstance(v, Mapping) or hasattr(v, "element_size"))
