"""The loss registry: what a loss is to the learner, and how it declares its own settings.

A loss is a function ``fn(inputs: LossInputs, settings) -> LossOutput`` registered under a name with
`register_loss`. Its settings are a frozen dataclass of its own (``settings=``): users pass them as
``.training(loss=NAME, loss_config={...})``; `LossSpec.make_settings` builds the dataclass from that dict when the
config is validated, so an unknown key or a bad value fails before anything starts, with the loss's name in the
message (validate values in the dataclass's ``__post_init__``). The learner builds the settings once and calls the
function on every minibatch.

Every loss returns the same `LossOutput`: the loss (this learner's share of the global token-mean, see
`rllib_p3o.core.losses.parts`), the ESS of the minibatch's importance ratios (P3O's statistic; a diagnostic for the
losses that do not use it) and its metrics. A loss is one module of this package: its formula as a small pure-torch
function, its settings, its registration, and what it needs from the learner (`OldLogprobs`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Type, Union

import torch


class OldLogprobs(str, enum.Enum):
    """When a loss needs π_old, the learner's log-probs before the update (one extra forward pass per update)."""

    NEVER = "never"
    ALWAYS = "always"
    FOR_OTHER_MODEL_ROWS = "for_other_model_rows"  # only for batches that hold rows another model wrote


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of a loss that has none (``loss_config`` must then be empty)."""


@dataclasses.dataclass(frozen=True)
class LossInputs:
    """One minibatch as a loss sees it. Token tensors are ``[B, T]`` (one entry per target token)."""

    logprobs: torch.Tensor  # log πθ of each target token (with gradient)
    behavior_logprobs: torch.Tensor  # log π_b: the policy that generated the token (engine, older weights, other model)
    advantages: torch.Tensor  # [B] per sequence, or [B, T]
    mask: torch.Tensor  # bool: completion (model) tokens; prompt, environment turns and padding are False
    ref_logprobs: Optional[torch.Tensor] = None  # log π_ref of the frozen initial model (with kl_ref_coeff > 0)
    kl_ref_coeff: float = 0.0
    entropy: Optional[torch.Tensor] = None  # per-token entropy (with entropy_coeff > 0)
    entropy_coeff: float = 0.0
    # [B] (per row) or [B, T] (per token) group index, for a loss whose ess_scope is "source" or "version"
    ess_groups: Optional[torch.Tensor] = None
    num_ess_groups: int = 0
    # log π_old: the learner's policy before this update, recomputed once per update (losses registered with
    # old_logprobs=OldLogprobs.ALWAYS, or for the batches that need it; None otherwise).
    old_logprobs: Optional[torch.Tensor] = None
    # [B] bool: rows another model wrote (a behavior model's, live or recorded), not this policy at any version;
    # None when the batch has none (`rllib_p3o.core.sources.other_model_source_ids`).
    other_model_rows: Optional[torch.Tensor] = None
    # [B] or [B, T] bool: the policy's own tokens sampled by weights the learner has moved from since (stale async
    # rows, a second optimizer step on a batch, offline data); None when there are none. Trust regions act on these.
    lagging: Optional[torch.Tensor] = None

    def common(self) -> Dict[str, Any]:
        """The regularizer arguments the losses' functions share, as keyword arguments."""
        return dict(
            ref_logprobs=self.ref_logprobs,
            kl_ref_coeff=self.kl_ref_coeff,
            entropy=self.entropy,
            entropy_coeff=self.entropy_coeff,
        )


class LossOutput(NamedTuple):
    """What every loss returns to the learner."""

    loss: torch.Tensor  # this learner's share of the global loss (summing the shares gives the loss)
    ess: torch.Tensor  # 0-dim: the ESS of the minibatch's ratios across all learners
    metrics: Mapping[str, torch.Tensor]  # global diagnostics, logged under the learner's results


LossFn = Callable[[LossInputs, Any], LossOutput]


class LossSpec(NamedTuple):
    """A registered loss: its function, its settings dataclass, over which tokens it wants its ESS groups (``ess_scope``:
    a function of its settings, None for a loss that takes no ``ess_groups``), and when it needs ``old_logprobs``
    (`OldLogprobs`, or a function of the loss's settings returning one: P3O's depends on its KL anchor); the learner
    asks `ess_scope_of` and `old_logprobs_needed` and reads none of a loss's settings itself."""

    name: str
    fn: LossFn
    settings: Type[Any]
    ess_scope: Optional[Callable[[Any], str]]
    old_logprobs: Union[OldLogprobs, Callable[[Any], OldLogprobs]] = OldLogprobs.NEVER
    # The loss's statistics (P3O's ESS, cap and KL) read the behavior log-probs as those of the distribution the
    # learner's log-probs are of: under top-p/top-k truncation the learner renormalizes over the sampler's recorded
    # kept sets, and the config refuses truncation without them (``kept_set_cap=0``: the truncated distribution's
    # log-probs are higher than any untruncated policy's, so even fresh samples would look off-policy).
    needs_untruncated_sampling: bool = False

    @property
    def ess_scoped(self) -> bool:
        """Whether the loss takes ESS groups (``inputs.ess_groups``) at all."""
        return self.ess_scope is not None

    def ess_scope_of(self, settings: Any) -> str:
        """The ESS groups the learner computes for this loss with these settings: ``"batch"`` (none: one ESS),
        ``"source"`` or ``"version"`` (`rllib_p3o.learner.row_groups.ess_groups`)."""
        return self.ess_scope(settings) if self.ess_scope is not None else "batch"

    def old_logprobs_needed(self, settings: Any) -> OldLogprobs:
        """When the learner must compute ``old_logprobs`` for this loss with these settings."""
        needs = self.old_logprobs
        return OldLogprobs(needs(settings) if callable(needs) else needs)

    def uses_old_logprobs(self, settings: Any) -> bool:
        """Whether the learner may have to compute ``old_logprobs`` for this loss with these settings."""
        return self.old_logprobs_needed(settings) is not OldLogprobs.NEVER

    def make_settings(self, loss_config: Optional[Mapping[str, Any]] = None) -> Any:
        """The settings dataclass from a ``loss_config`` dict; ValueError naming the loss on an unknown key or a
        value the dataclass refuses."""
        loss_config = dict(loss_config or {})
        fields = {f.name for f in dataclasses.fields(self.settings)}
        unknown = sorted(set(loss_config) - fields)
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            raise ValueError(
                f"loss {self.name!r} has no setting {', '.join(map(repr, unknown))} (its settings: {known})."
            )
        try:
            return self.settings(**loss_config)
        except (TypeError, ValueError) as e:
            raise ValueError(f"loss {self.name!r}: {e}") from e


LOSSES: Dict[str, LossSpec] = {}


def register_loss(
    name: str,
    settings: Type[Any] = NoSettings,
    ess_scope: Optional[Callable[[Any], str]] = None,
    old_logprobs: Union[OldLogprobs, Callable[[Any], OldLogprobs]] = OldLogprobs.NEVER,
    needs_untruncated_sampling: bool = False,
) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn(inputs, settings) -> LossOutput`` under ``name``.

    ``settings``: the loss's frozen settings dataclass (defaults = the loss's defaults). ``ess_scope``: for a loss
    that uses ``inputs.ess_groups``, a function ``settings -> "batch" | "source" | "version"`` (the scope is one of
    the loss's settings), so the learner computes them. ``old_logprobs``:
    when the loss reads ``inputs.old_logprobs``, which the learner then computes before the update (one forward pass):
    an `OldLogprobs`, or a function ``settings -> OldLogprobs`` when that depends on the loss's settings.
    ``needs_untruncated_sampling``: the config refuses top-p/top-k sampling with this loss unless the kept sets are
    recorded (``kept_set_cap > 0``; `LossSpec`).
    """
    if not dataclasses.is_dataclass(settings):
        raise TypeError(f"settings of loss {name!r} must be a dataclass, got {settings!r}")

    def register(fn: LossFn) -> LossFn:
        LOSSES[name] = LossSpec(
            name,
            fn,
            settings,
            ess_scope,
            OldLogprobs(old_logprobs) if not callable(old_logprobs) else old_logprobs,
            needs_untruncated_sampling,
        )
        return fn

    return register


def get_loss(name: str) -> LossSpec:
    """The registered loss ``name``; a ValueError lists the registered names otherwise."""
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; registered losses: {', '.join(sorted(LOSSES))}.")
    return LOSSES[name]


def output(loss: torch.Tensor, metrics: Mapping[str, torch.Tensor]) -> LossOutput:
    """`LossOutput` from an objective function's ``(loss, metrics)`` pair (its metrics hold ``ess``)."""
    return LossOutput(loss, metrics["ess"], metrics)
