"""The baselines peers ship against off-policy rollouts, and P3O's proximal variant (the math:
`rllib_p3o.core.offpolicy_objectives`). All but ``cispo`` need π_old, which the learner recomputes once per update."""

import dataclasses

from rllib_p3o.core.kl_estimators import KL_ESTIMATORS
from rllib_p3o.core.losses.grpo import GRPOSettings
from rllib_p3o.core.losses.registry import LossInputs, LossOutput, output, register_loss
from rllib_p3o.core.offpolicy_objectives import cispo_loss, decoupled_grpo_loss, p3o_proximal_loss


@dataclasses.dataclass(frozen=True)
class GRPOTISSettings(GRPOSettings):
    """GRPO's clip range, and C of the truncated importance weight min(π_old/π_b, C) (verl's default 2.0)."""

    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tis_cap >= 1.0:
            raise ValueError(f"tis_cap must be >= 1, got {self.tis_cap}")


@dataclasses.dataclass(frozen=True)
class GRPOSeqMaskSettings(GRPOSettings):
    """GRPO's clip range, and the band of the per-sequence geometric-mean ratio π_old/π_b outside which a sequence
    is dropped (verl's geometric rejection preset: [0.999, 1.001])."""

    seq_mask_low: float = 0.999
    seq_mask_high: float = 1.001

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.seq_mask_low <= 1.0 <= self.seq_mask_high:
            raise ValueError(
                f"need 0 < seq_mask_low <= 1 <= seq_mask_high, got [{self.seq_mask_low}, {self.seq_mask_high}]"
            )


@dataclasses.dataclass(frozen=True)
class CISPOSettings:
    """The IS weight's clip range [1 - clip_low, 1 + clip_high]; MiniMax-M1 sets no lower bound (clip_low = 1)."""

    clip_low: float = 1.0
    clip_high: float = 0.28

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"clip_low must be in [0, 1], got {self.clip_low}")
        if not self.clip_high >= 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")


@register_loss("grpo_tis", settings=GRPOTISSettings, needs_old_logprobs=True)
def grpo_tis(inputs: LossInputs, settings: GRPOTISSettings) -> LossOutput:
    """``ℓ_t = -min(π_old/π_b, C) · min(ρ_t·A_t, clip(ρ_t, 1-ε_low, 1+ε_high)·A_t)``, ``ρ_t = πθ/π_old``."""
    loss, metrics = decoupled_grpo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), clip_low=settings.clip_low, clip_high=settings.clip_high, tis_cap=settings.tis_cap,
    )  # fmt: skip
    return output(loss, metrics)


@register_loss("grpo_seq_mask", settings=GRPOSeqMaskSettings, needs_old_logprobs=True)
def grpo_seq_mask(inputs: LossInputs, settings: GRPOSeqMaskSettings) -> LossOutput:
    """GRPO-clip against π_old on the sequences whose geometric-mean π_old/π_b lies in the band; others dropped."""
    loss, metrics = decoupled_grpo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), clip_low=settings.clip_low, clip_high=settings.clip_high,
        seq_mask_band=(settings.seq_mask_low, settings.seq_mask_high),
    )  # fmt: skip
    return output(loss, metrics)


@register_loss("cispo", settings=CISPOSettings)
def cispo(inputs: LossInputs, settings: CISPOSettings) -> LossOutput:
    """``ℓ_t = -sg(clip(r_t, 1-ε_low, 1+ε_high)) · logπθ_t · A_t``, ``r_t = πθ/π_b``."""
    loss, metrics = cispo_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.advantages, inputs.mask, **inputs.common(),
        clip_low=settings.clip_low, clip_high=settings.clip_high,
    )  # fmt: skip
    return output(loss, metrics)


@dataclasses.dataclass(frozen=True)
class P3OProximalSettings:
    """The per-token KL estimator of the term toward the adaptive mixture (`rllib_p3o.core.kl_estimators`); FeynRL's
    P4O uses ``"k3_clamped"``, the default here, so that the reference is reproduced as it is."""

    kl_estimator: str = "k3_clamped"

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")


@register_loss("p3o_proximal", settings=P3OProximalSettings, needs_old_logprobs=True, needs_untruncated_sampling=True)
def p3o_proximal(inputs: LossInputs, settings: P3OProximalSettings) -> LossOutput:
    """FeynRL's P4O: ``-sg(min(r, c))·logπθ·A + (1-c)·K(πθ, π_m; π_b)``, c = min(ESS_b, ESS_p), π_m the mixture of
    π_b and π_old weighted by 1 - ESS_b and 1 - ESS_p."""
    loss, metrics = p3o_proximal_loss(
        inputs.logprobs, inputs.behavior_logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        **inputs.common(), kl_estimator=settings.kl_estimator,
    )  # fmt: skip
    return output(loss, metrics)
