"""P3O's settings checked group by group (`rllib_p3o.core.settings.GROUPS`), in one place per group: each setting
against its declaration (choices, minimum), then the group's rules that involve more than one setting. The checks
of what the settings name (files, models, tokenizers, datasets) are `rllib_p3o.driver.preflight.world_problems`.

Every function returns the problems it finds as messages that say what to fix; `P3OConfig.validate` raises the first.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List

from rllib_p3o.core.losses import LOSSES, get_loss
from rllib_p3o.core.settings import (
    EVALUATION,
    GROUPS,
    LOSSES_GROUP,
    MODEL,
    OFFLINE,
    PRECISION,
    SAMPLING,
    in_group,
)
from rllib_p3o.core.sources import behavior_sample_counts
from rllib_p3o.data.provenance import AUTO, PROVENANCE_CHOICES
from rllib_p3o.learner.compute import ENTROPY_REFUSAL
from rllib_p3o.learner.compute import validate_options as validate_module_options

# A group's rules: a `P3OConfig` (typed loosely: the config's module imports this one) -> its problems.
Rules = Callable[[Any], Iterator[str]]


def problems(config: Any, group: str) -> List[str]:
    """The problems of ``group``'s settings: the declared limits of each, then the group's rules (`GROUP_RULES`)."""
    found = [p for s in in_group(group) for p in [s.problem(getattr(config, s.name))] if p]
    rules = GROUP_RULES.get(group)
    return found + (list(rules(config)) if rules else [])


def _model(config: Any) -> Iterator[str]:
    if not config.policy_model:
        yield "P3OConfig needs a policy model: .training(model='/path/to/hf-causal-lm')."
    own = config._model_config if isinstance(config._model_config, dict) else {}
    try:
        # The user's own keys: the merged model_config would build P3O's part from settings not yet validated.
        validate_module_options(own)
    except ValueError as e:
        yield f"rl_module model_config: {e}"
    yield from _fused_head_with_entropy(own.get("fused_head", config.fused_head), config.entropy_coeff)


def _fused_head_with_entropy(fused_head: Any, entropy_coeff: Any) -> Iterator[str]:
    """``fused_head="on"`` (the setting, or the model_config key over it) computes no entropy: refused with an
    entropy bonus, which needs each token's entropy over the vocabulary ("auto" keeps the chunked head for it)."""
    if fused_head == "on" and isinstance(entropy_coeff, (int, float)) and entropy_coeff > 0:
        yield f"entropy_coeff={entropy_coeff}: {ENTROPY_REFUSAL}."


def _losses(config: Any) -> Iterator[str]:
    if config.loss not in LOSSES:
        yield f"Unknown loss {config.loss!r}; registered losses: {', '.join(sorted(LOSSES))}."
        return
    try:
        config.loss_settings()
    except ValueError as e:
        yield f"loss_config: {e}"
    yield from _untruncated_sampling(config)
    if config.minibatch_size is not None and config.minibatch_size <= 0:
        yield "minibatch_size must be positive or None."


def _untruncated_sampling(config: Any) -> Iterator[str]:
    """P3O's losses read the behavior log-probs as those of the distribution the learner's log-probs are of. With
    processed log-probs and top-p/top-k truncation the behavior log-probs are the truncated distribution's,
    renormalized; so each token records its kept set (`kept_set_cap`) and the learner renormalizes its log-prob
    over the same set (`rllib_p3o.learner.compute.kept_set_logprobs`): the ratio compares like with like. Refused:
    truncated sampling with ``kept_set_cap=0`` (fresh samples would look off-policy, ratio < 1, and pull the
    policy toward the truncated distribution), and top-k alone with a ``kept_set_cap`` below ``top_k`` (every
    kept set would overflow the record). For the policy's sampling and each behavior model's."""
    if config.logprobs_mode != "processed":
        return
    needs_exact = get_loss(config.loss).needs_untruncated_sampling
    samplers = [("the policy", config.top_p, config.top_k)] + [
        (
            f"behavior model {s.get('name') or s.get('model')}",
            s.get("top_p", config.top_p),
            s.get("top_k", config.top_k),
        )
        for s in config.behavior_models
    ]
    for who, top_p, top_k in samplers:
        truncated = (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0)
        if not truncated:
            continue
        if config.kept_set_cap == 0 and needs_exact:
            yield (
                f"loss={config.loss!r} needs the learner's log-probs renormalized over the sampler's kept set, but "
                f"{who} samples with top_p={top_p}, top_k={top_k} and kept_set_cap=0 records no kept set: the "
                "behavior log-probs would be those of the truncated distribution, so even fresh samples would look "
                "off-policy. Set kept_set_cap > 0, sample with top_p=1.0 and top_k=-1, or use a loss without this "
                "requirement (e.g. 'grpo')."
            )
        full_top_k = top_k is not None and top_k > 0 and (top_p is None or top_p >= 1.0)
        if config.kept_set_cap > 0 and full_top_k and top_k > config.kept_set_cap:
            yield (
                f"{who} samples with top_k={top_k} but kept_set_cap={config.kept_set_cap}: every token's kept set "
                f"({top_k} tokens) would be larger than recorded and left out of the loss. Set kept_set_cap >= "
                f"{top_k} (or 0 to record none)."
            )


def _sampling(config: Any) -> Iterator[str]:
    for spec in config.behavior_models:
        if "model" not in spec:
            yield f"each behavior model needs a 'model' path, got {spec}."
    behavior_samples = sum(behavior_sample_counts(config.behavior_models, config.group_size))
    if config.behavior_models and behavior_samples > config.group_size:
        yield f"behavior models take {behavior_samples} samples per group, more than group_size={config.group_size}."
    if config.async_sampling and config.num_env_runners < 1 and not config.in_evaluation:
        yield "async_sampling needs remote EnvRunners (num_env_runners >= 1)."
    in_flight = config.max_requests_in_flight_per_env_runner
    if config.async_sampling and in_flight > config.max_staleness:
        # Each weight push queues behind a runner's calls in flight: the data arrive that many versions old.
        yield (
            f"with max_requests_in_flight_per_env_runner={in_flight}, async samples are {in_flight} weight versions "
            f"old when the learner takes them, more than max_staleness={config.max_staleness}: every sample would be "
            f"dropped. Raise max_staleness to at least {in_flight}, or lower max_requests_in_flight_per_env_runner."
        )
    if config.inflight_weight_updates:
        yield from _inflight(config)


def _inflight(config: Any) -> Iterator[str]:
    """What in-flight weight updates need: a runner that steps its own engine between weight loads."""
    import os

    fix = "Without inflight_weight_updates, async sampling loads new weights between two samples instead."
    if not config.async_sampling:
        yield (
            "inflight_weight_updates needs async_sampling=True: in sync mode every sample is generated with the "
            "newest weights already. Set async_sampling=True, or leave inflight_weight_updates off."
        )
    if (config.env_config or {}).get("multi_turn_env"):
        yield f"inflight_weight_updates supports single-turn rollouts only, not multi_turn_env. {fix}"
    if config.behavior_models:
        yield (
            "inflight_weight_updates does not support behavior_models: a prompt group would mix completions kept "
            f"across samples with a frozen model's generated in one. {fix}"
        )
    if config.lora is not None:
        yield (
            "inflight_weight_updates does not support LoRA: a running request holds the adapter it started with, so "
            f"a new adapter cannot reach it in place. {fix}"
        )
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "1" or (config.vllm_kwargs or {}).get(
        "async_scheduling"
    ):
        yield (
            "inflight_weight_updates needs the in-process vLLM engine that the runner steps itself "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0, no async_scheduling): a multiprocess engine steps on its own, so new "
            f"weights could not land between two of its steps. {fix}"
        )
    if config.max_requests_in_flight_per_env_runner > 1:
        yield (
            "inflight_weight_updates keeps one sample() call per runner (the runner holds the groups it continues "
            f"itself); got max_requests_in_flight_per_env_runner={config.max_requests_in_flight_per_env_runner}. "
            "Set env_runners(max_requests_in_flight_per_env_runner=1)."
        )


def _evaluation(config: Any) -> Iterator[str]:
    if config.eval_temperature is None:
        yield "eval_temperature must be >= 0 (0: greedy), got None."


def _offline(config: Any) -> Iterator[str]:
    if not 0.0 <= config.resolved_offline_fraction <= 1.0:
        yield f"offline_fraction must be in [0, 1], got {config.offline_fraction}."
    if config.resolved_offline_fraction > 0 and not config.is_offline:
        yield "offline_fraction > 0 needs an offline dataset: .offline_data(input_=PATH)."
    yield from _offline_provenance(config.offline_provenance)


def _offline_provenance(value: Any) -> Iterator[str]:
    choices = " or ".join(repr(c) for c in PROVENANCE_CHOICES)
    fixed = tuple(c for c in PROVENANCE_CHOICES if c != AUTO)
    if isinstance(value, str):
        if value not in PROVENANCE_CHOICES:
            yield f"offline_provenance must be {choices}, or a dict {{input path: 'policy' | 'other'}}; got {value!r}."
        return
    if not isinstance(value, dict):
        yield f"offline_provenance must be {choices}, or a dict {{input path: 'policy' | 'other'}}; got {value!r}."
        return
    for path, answer in value.items():
        if answer not in fixed:
            yield f"offline_provenance[{path!r}] must be 'policy' or 'other', got {answer!r}."


def _precision(config: Any) -> Iterator[str]:
    if config.rollout_quantization and config.lora is not None:
        yield (
            "rollout_quantization with LoRA is not supported: the engine's frozen base is loaded from the model "
            "directory and never synced, so its FP8 rounding could not be checked."
        )


# Each group's rules beyond its settings' declared limits (a group without an entry has none: the sync and resources
# groups' declarations say it all; the cluster's fit is `rllib_p3o.driver.preflight.check_cluster_fits`).
GROUP_RULES: Dict[str, Rules] = {
    MODEL: _model,
    LOSSES_GROUP: _losses,
    SAMPLING: _sampling,
    EVALUATION: _evaluation,
    OFFLINE: _offline,
    PRECISION: _precision,
}
assert set(GROUP_RULES) <= set(GROUPS)
