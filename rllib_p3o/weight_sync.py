"""Weight sync: the learner's weights into the runners' vLLM engines, in place, checked on a probe sequence.

One push (driver side, `WeightSync`) carries the next weights version (``weights_seq_no``) and the learner's module
state (put into Ray's object store once, shared by all runners). Each runner (`VLLMEnvRunner.load_policy_weights`)
reloads its engine with `hf_weights` of that state. With ``verify_weight_sync`` the engine's log-probs of a fixed
probe sequence are compared with the learner's (`rllib_p3o.probe`): at load, where the weights must be verified
before anything else runs (`push_verified`, `push_to`), or riding along with the runner's next generate call (`push`,
every iteration; the driver checks the result with `check` before it uses the samples). A failed check raises
`WeightSyncError`: a silent sync failure would otherwise look like staleness.

The payload, a dict:
    rl_module       the learner's module state, ``{"default_policy": {"lm.<HF name>": tensor}}`` or its inner dict
                    (or a `PackedTensors` of it), or an ObjectRef to any of these
    weights_seq_no  the weights version being loaded
    probe           optional: ``{"token_ids": [int, ...], "logprobs": [float, ...]}``, the probe and the learner's
                    log-prob of each token after the first: the runner checks at load; or ``{"token_ids": [...]}``
                    alone: the runner scores the probe with its next generate call and returns it (`ProbeResult`)
    tolerance       largest allowed |learner - engine| log-prob on the probe (checks at load)
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

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
from rllib_p3o.probe import LearnerProbes, ProbeResult, WeightSyncError, check_probe  # noqa: F401 (public here)

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


class WeightSync:
    """The driver's side: counts weights versions and pushes each new version to every engine runner.

    Blocking pushes wait (at most ``timeout_s``) for every healthy runner and return the worst (max) of their load
    statistics; a runner that does not answer in time raises `WeightSyncError` naming it, never a silent hang. A
    runner that dies during a push is left out: RLlib restarts it and `push_to` loads it before it samples again.
    Non-blocking pushes (async sampling with remote runners) do not wait: each runner loads the weights after its
    current sample() (Ray actors are serial); the statistics returned are those of the latest push that has come
    back, and errors of earlier pushes are raised when their results come back.

    Probe checks (with ``probe_token_ids``; `rllib_p3o.probe`): `push` has the runners score the probe with their next
    generate call, and the driver checks what they return (`check`, `require_verified`) while the learner's side is
    scored in the background; `push_verified` and `push_to` check at load. Call `settle` before the learner's
    weights change or the learner is used otherwise.
    """

    def __init__(self, learner_group: LearnerGroup, runners: EngineRunners, *,
                 probe_token_ids: Optional[List[int]], tolerance: float = DEFAULT_TOLERANCE,
                 push_async: bool = False, timeout_s: Optional[float] = None, max_staleness: int = 0):
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
        self.probes = (LearnerProbes(self._learner_probe, tolerance, keep=max_staleness + 2)
                       if probe_token_ids is not None else None)

    def push(self, blocking: Optional[bool] = None) -> Dict[str, float]:
        """Push the learner's current weights as the next version, to be checked with the runners' next generate
        call; returns the runners' load statistics and the latest probe check's."""
        self.weights_seq_no += 1
        if blocking is None:
            blocking = not self.push_async
        checked = self.probes.last_stats if self.probes is not None else {}
        if not blocking:
            payload = self._payload(check_at_load=False)
            for _, stats in self.runners.fetch_ready(SYNC_TAG, timeout_s=0.0):
                self._last_stats = stats
            self.runners.start({i: lambda r: r.load_policy_weights(payload) for i in self.runners.healthy_ids()},
                               tag=SYNC_TAG)
            stats = {**self._last_stats, **self.driver_stats}
        else:
            stats = self._push_to(self.runners.healthy_ids(), check_at_load=False)
        stats.update(checked)
        if self.probes is not None:
            # After the loads it waited for (a blocking push), so that the learner's probe does not compete with the
            # engines' reload for the cores; it overlaps the next generation instead.
            self.probes.start(self.weights_seq_no)
        return stats

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
        """After a checkpoint restore: continue the version count past the restored iterations, push and wait.

        RLlib's own post-restore sync is fire-and-forget; the restored weights must be in the engines (and verified)
        before sampling goes on.
        """
        self.weights_seq_no = max(self.weights_seq_no, iteration + 1)
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
        results = self.runners.call({i: lambda r: r.load_policy_weights(payload) for i in runner_ids},
                                    timeout_s=self.timeout_s)
        hung = sorted((set(runner_ids) - set(results)) & set(self.runners.healthy_ids()))
        if hung:
            raise WeightSyncError(
                f"EnvRunner {', '.join(map(str, hung))} did not finish loading weights v{self.weights_seq_no} within "
                f"weight_sync_timeout_s={self.timeout_s} s.")
        stats = [r for r in results.values() if r]
        worst = {k: float(np.max([r[k] for r in stats])) for k in stats[0]} if stats else {}
        if check_at_load and self.probes is not None:
            self.probes.checked_at_load(list(results), self.weights_seq_no, worst.get(metrics.PROBE_MAX_ABS_DIFF),
                                        self.driver_stats[metrics.PROBE_LEARNER_S])
        return {**worst, **self.driver_stats}

    def _payload(self, check_at_load: bool) -> Dict[str, Any]:
        """The next version's payload; its driver-side time split goes to `driver_stats`. With ``check_at_load`` the
        learner's probe is scored before the payload leaves (else `push` has it scored in the background)."""
        t0 = time.perf_counter()
        state = self.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                             inference_only=True)[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
        state = state.get(DEFAULT_MODULE_ID, state)
        payload: Dict[str, Any] = {RL_MODULE: ray.put(PackedTensors(state)), VERSION: self.weights_seq_no}
        t1 = time.perf_counter()
        self.driver_stats = {metrics.GATHER_S: t1 - t0, metrics.SYNC_BYTES: float(_num_bytes(state))}
        if self.probes is not None:
            payload[PROBE] = {PROBE_TOKEN_IDS: self.probe_token_ids}
            if check_at_load:
                self.probes.start(self.weights_seq_no)
                payload[PROBE][PROBE_LOGPROBS] = self.probes.logprobs(self.weights_seq_no)
                payload[TOLERANCE] = self.tolerance
                self.driver_stats[metrics.PROBE_LEARNER_S] = time.perf_counter() - t1
        return payload

    def _learner_probe(self) -> List[float]:
        """The learner's log-probs of the probe with its current weights (the first learner's: they all agree)."""
        probe_ids = self.probe_token_ids  # a local: the lambda must not capture self (it is shipped to learners)
        results = self.learner_group.foreach_learner(
            lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().sequence_logprobs(probe_ids))
        return [r.get() for r in results][0]


def _num_bytes(state: Mapping[str, Any]) -> int:
    """Bytes of the tensors of a (possibly nested) module state."""
    return sum(_num_bytes(v) if isinstance(v, Mapping) else int(v.numel() * v.element_size())
               for v in state.values() if isinstance(v, Mapping) or hasattr(v, "element_size"))
