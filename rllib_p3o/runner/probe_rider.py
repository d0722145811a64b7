"""The runner's side of a riding-along probe check (`rllib_p3o.sync.probe`): the policy engine, wrapped so that its
next ``generate`` call also scores the probe sequence once a sync has armed it."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from rllib_p3o.runner.vllm_engine import probe_logprobs, probe_request
from rllib_p3o.sync.probe import ProbeResult


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

    @property
    def armed(self) -> bool:
        """Whether a probe waits to be scored with the next generate call."""
        return self._armed is not None

    def take_result(self) -> Optional[ProbeResult]:
        """The probe scored since the last call, if any (each result is handed out once)."""
        result, self._result = self._result, None
        return result

    def generate(self, prompts: Sequence[Any], sampling_params: Any = None, **kwargs: Any) -> List[Any]:
        if self._armed is None:
            return self.llm.generate(prompts, sampling_params, **kwargs)
        version, token_ids = self._armed
        prompts = list(prompts)
        params = (
            list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        )
        probe_prompt, probe_params = probe_request(token_ids)
        if isinstance(kwargs.get("lora_request"), (list, tuple)):  # per request: the probe uses the policy's adapter
            kwargs["lora_request"] = list(kwargs["lora_request"]) + [kwargs["lora_request"][0]]
        outputs = self.llm.generate(prompts + [probe_prompt], params + [probe_params], **kwargs)
        self._armed = None
        self._result = ProbeResult(self.runner_id, version, probe_logprobs(token_ids, outputs[-1]).tolist())
        return outputs[:-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)
