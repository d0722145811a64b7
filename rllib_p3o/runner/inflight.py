"""In-flight weight updates: the policy engine keeps generating across sample() calls, and new weights reach the
sequences it is still generating.

Without them (async sampling at chunk boundaries), a runner's ``sample()`` generates its prompt groups to the end
with the weights it started with, so each chunk waits on its longest completion while the engine's batch empties.
With them (``inflight_weight_updates=True``), the runner steps the engine itself (`InflightEngine`, vLLM's
``LLMEngine.step`` loop) with more prompt groups in it than one call returns: a call submits the driver's new groups
and returns as soon as that many groups (the oldest first to finish) are complete; the others stay in the engine,
mid-generation. The driver's next weight load runs between two calls, that is between two engine steps of those
sequences, which continue with the new weights. So a completion may span weight versions: vLLM labels every output
token with the version that sampled it (``set_weight_version``; `token_versions`), and each token's behavior
log-prob is that version's.

The KV cache of a running sequence's prefix (``inflight_kv_cache``):

- ``"recompute"`` (the default): after a load, every running sequence is preempted and its prompt and tokens so far
  are prefilled again with the new weights (``reset_prefix_cache(reset_running_requests=True)``). Every later token
  is then sampled exactly from its version's policy given its prefix; a load costs one prefill of the running
  sequences.
- ``"keep"`` (PipelineRL's): the prefix's KV computed by older weights is kept, so later tokens are sampled from the
  new weights attending to old-weight keys and values: their behavior log-prob is what was sampled from, but not
  exactly the new version's log-prob of the token given its prefix (the learner's ratio carries the difference).
  The engine runs without a prefix cache then (a new prompt must never reuse old-weight KV).

Weights arrive only between calls (a Ray actor runs one method at a time), so where they land in a generation is
fixed by the calls' order: a run replays the same way. Single-turn policy generation only (multi-turn episodes,
behavior models and LoRA adapters are refused at config validation).
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Deque, Dict, Hashable, List, Sequence, Tuple

import numpy as np

KV_CACHE_MODES = ("recompute", "keep")


def token_versions(completion: Any, default: int) -> np.ndarray:
    """The weights version of each token of a vLLM ``CompletionOutput`` (its ``weight_versions`` spans, labelled by
    `InflightEngine.set_version`), ``default`` where it has none: int64 ``[tokens]``."""
    n = len(completion.token_ids)
    out = np.full(n, int(default), dtype=np.int64)
    for span in getattr(completion, "weight_versions", None) or ():
        if str(span.version).lstrip("-").isdigit():
            out[span.start : min(span.end, n)] = int(span.version)
    return out


class InflightEngine:
    """A ``vllm.LLM`` (in-process engine) whose requests outlive a call: `submit` adds prompt groups, `collect` steps
    the engine until enough of them are complete and returns those; `generate` runs other requests (evaluation,
    probes, scoring) to their end while the held ones keep going. Everything else is the engine's."""

    def __init__(self, llm: Any, kv_cache: str = "recompute", version: int = 0):
        if kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"inflight_kv_cache must be one of {', '.join(KV_CACHE_MODES)}, got {kv_cache!r}")
        self.llm, self.kv_cache = llm, kv_cache
        self._keys: Dict[str, Hashable] = {}  # request id -> the caller's key (a prompt group)
        self._done: Deque[Tuple[Hashable, Any]] = collections.deque()  # finished, not yet collected
        self._isolated: Dict[str, Any] = {}  # finished outputs of a running `generate`
        self._ids = itertools.count()
        self.set_version(version)

    @property
    def engine(self) -> Any:
        return self.llm.llm_engine

    def set_version(self, version: int) -> None:
        """Label the tokens sampled from now on with ``version``."""
        self.engine.set_weight_version(str(int(version)))

    def held(self) -> List[Hashable]:
        """The keys of the submitted requests not yet collected (running, or finished and waiting)."""
        return list(self._keys.values()) + [key for key, _ in self._done]

    def submit(self, keys: Sequence[Hashable], prompts: Sequence[Any], params: Sequence[Any]) -> None:
        """Add one request per key (its prompt, its ``SamplingParams``, ``n`` completions each)."""
        for key, request_id in zip(keys, self._add(prompts, params)):
            self._keys[request_id] = key

    def collect(self, count: int) -> Tuple[List[Tuple[Hashable, Any]], float]:
        """Step the engine until ``count`` submitted requests are finished (or none is left running), and return the
        first ``count`` to finish, in finishing order, as ``(key, RequestOutput)``; the rest stay. Also the seconds
        spent stepping."""
        t0 = time.perf_counter()
        while len(self._done) < count and self._keys:
            self._step()
        out = [self._done.popleft() for _ in range(min(count, len(self._done)))]
        return out, time.perf_counter() - t0

    def generate(self, prompts: Sequence[Any], sampling_params: Any = None, **kwargs: Any) -> List[Any]:
        """``LLM.generate``'s result for these requests alone: stepped to their end, with the held requests going on
        beside them (their finished outputs wait for `collect`). ``lora_request`` is not supported here."""
        if kwargs.get("lora_request") is not None:
            raise ValueError("in-flight weight updates do not support LoRA adapters")
        prompts = list(prompts)
        params = (
            list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        )
        ids = self._add(prompts, params)
        for request_id in ids:
            self._isolated[request_id] = None
        while any(self._isolated[i] is None for i in ids):
            self._step()
        return [self._isolated.pop(i) for i in ids]

    def clear(self) -> int:
        """Drop every held request (running ones are aborted): their weights are being replaced by unrelated ones.
        Returns how many were held."""
        held = len(self._keys) + len(self._done)
        if self._keys:
            self.engine.abort_request(list(self._keys))
        self._keys.clear()
        self._done.clear()
        return held

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        """After new weights: no KV of older weights is reused. Idle, the prefix cache is dropped; with sequences
        running, ``"recompute"`` preempts them (their prompts and tokens so far are prefilled again with the new
        weights) and ``"keep"`` leaves their KV as it is (the engine has no prefix cache to drop)."""
        running = self.engine.has_unfinished_requests()
        if running and self.kv_cache == "keep":
            return True
        ok = self.engine.reset_prefix_cache(reset_running_requests=running)
        if not ok:
            raise RuntimeError("the engine did not drop its prefix cache after new weights were loaded")
        return ok

    def _add(self, prompts: Sequence[Any], params: Sequence[Any]) -> List[str]:
        """Requests added under ids of our own (the ids their outputs carry; vLLM adds a random suffix inside)."""
        from vllm.sampling_params import RequestOutputKind

        ids = []
        for prompt, p in zip(prompts, params):
            request_id = f"p3o-{next(self._ids)}"
            p = p.clone()
            p.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, all n completions (as LLM's)
            self.engine.add_request(request_id, prompt, p)
            ids.append(request_id)
        return ids

    def _step(self) -> None:
        if not self.engine.has_unfinished_requests():
            raise RuntimeError(
                f"the engine has no request left but {len(self._keys) + len(self._isolated)} are awaited: they were "
                "dropped without a final output"
            )
        for output in self.engine.step():
            if not output.finished:
                continue
            if output.request_id in self._isolated:
                self._isolated[output.request_id] = output
            elif output.request_id in self._keys:
                self._done.append((self._keys.pop(output.request_id), output))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)
