"""GRPO / PPO-clip, the baseline (the math: `rllib_p3o.core.objectives.grpo_loss`)."""

import dataclasses

from rllib_p3o.core.losses.registry import LossInputs, LossOutput, output, register_loss
from rllib_p3o.core.objectives import grpo_loss


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """``clip(r, 1 - clip_low, 1 + clip_high)``: ε_low and ε_high of the clipped surrogate (DAPO's clip-higher uses
    clip_high > clip_low)."""

    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if not self.clip_high >= 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")


@register_loss("grpo", settings=GRPOSettings)
def grpo(inputs: LossInputs, settings: GRPOSettings) -> LossOutput:
    """``ℓ_t = -min(r_t·A_t, clip(r_t, 1 - ε_low, 1 + ε_high)·A_t)``, token-mean over the global batch."""
    loss, metrics = grpo_loss(
        inputs.logprobs,
        inputs.behavior_logprobs,
        inputs.advantages,
        inputs.mask,
        **inputs.common(),
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
    )
    return output(loss, metrics)
