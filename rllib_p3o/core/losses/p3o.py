"""P3O and its two ablations (the math: `rllib_p3o.core.objectives.p3o_loss`). P3O has no settings: the ESS of the
batch takes the place of a clip range and a KL coefficient."""

from rllib_p3o.core.losses.registry import LossInputs, LossOutput, NoSettings, output, register_loss
from rllib_p3o.core.objectives import p3o_loss


def _p3o(inputs: LossInputs, cap: bool = True, behavior_kl: bool = True) -> LossOutput:
    loss, metrics = p3o_loss(
        inputs.logprobs,
        inputs.behavior_logprobs,
        inputs.advantages,
        inputs.mask,
        **inputs.common(),
        ess_groups=inputs.ess_groups,
        num_ess_groups=inputs.num_ess_groups,
        cap=cap,
        behavior_kl=behavior_kl,
    )
    return output(loss, metrics)


@register_loss("p3o", ess_scoped=True, needs_untruncated_sampling=True)
def p3o(inputs: LossInputs, settings: NoSettings) -> LossOutput:
    """``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t + (1 - ESS)·K(logπθ_t - logπ_b_t)``: the paper's objective."""
    return _p3o(inputs)


@register_loss("p3o_no_cap", ess_scoped=True, needs_untruncated_sampling=True)
def p3o_no_cap(inputs: LossInputs, settings: NoSettings) -> LossOutput:
    """Ablation of P3O without the cap: ``ℓ_t = -sg(r_t)·logπθ_t·A_t + (1 - ESS)·K(logπθ_t - logπ_b_t)``.

    Plain importance-weighted REINFORCE plus P3O's ESS-weighted KL: separates what the cap does from the KL."""
    return _p3o(inputs, cap=False)


@register_loss("p3o_no_kl", ess_scoped=True, needs_untruncated_sampling=True)
def p3o_no_kl(inputs: LossInputs, settings: NoSettings) -> LossOutput:
    """Ablation of P3O without the KL term: ``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t``.

    Only the ESS cap adapts to the batch; nothing pulls the policy toward the behavior policy."""
    return _p3o(inputs, behavior_kl=False)
