"""Losses by name: the registry the learner, the config's validation and the examples' ``--loss`` choices read.

Each entry is one pure-torch function of ``(logprobs, behavior_logprobs, advantages, mask, **kwargs)`` returning
``(loss, metrics)`` (the objectives' contract, `rllib_p3o.core.objectives`), and the config keys it takes. Registered:

    p3o          -sg(min(r, ESS))·logπθ·A + (1 - ESS)·K(logπθ - logπ_b)          (the paper's objective)
    p3o_no_cap   -sg(r)·logπθ·A           + (1 - ESS)·K(logπθ - logπ_b)          (ablation: no ESS cap)
    p3o_no_kl    -sg(min(r, ESS))·logπθ·A                                        (ablation: no ESS-weighted KL)
    grpo         -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)                         (PPO-clip baseline)

A new loss: ``register_loss("name", config_keys=(...), ess_scoped=...)(fn)``.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Tuple

from rllib_p3o.core.objectives import grpo_loss, p3o_loss

LossFn = Callable[..., Tuple]


class LossSpec(NamedTuple):
    """A registered loss: its function, the `P3OConfig` keys passed to it, and whether it takes ``ess_groups``."""

    fn: LossFn
    config_keys: Tuple[str, ...]
    ess_scoped: bool


LOSSES: Dict[str, LossSpec] = {}


def register_loss(name: str, config_keys: Tuple[str, ...] = (), ess_scoped: bool = False) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn`` under ``name`` (``ess_scoped``: it takes ``ess_groups``/``num_ess_groups``)."""
    def register(fn: LossFn) -> LossFn:
        LOSSES[name] = LossSpec(fn, tuple(config_keys), ess_scoped)
        return fn
    return register


def get_loss(name: str) -> LossSpec:
    """The registered loss ``name``; a ValueError lists the registered names otherwise."""
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; registered losses: {', '.join(sorted(LOSSES))}.")
    return LOSSES[name]


register_loss("p3o", ess_scoped=True)(p3o_loss)
register_loss("grpo", config_keys=("clip_low", "clip_high"))(grpo_loss)


@register_loss("p3o_no_cap", ess_scoped=True)
def p3o_no_cap_loss(logprobs, behavior_logprobs, advantages, mask, **kwargs):
    """Ablation of P3O without the cap: ``ℓ_t = -sg(r_t)·logπθ_t·A_t + (1 - ESS)·K(logπθ_t - logπ_b_t)``.

    Plain importance-weighted REINFORCE plus P3O's ESS-weighted KL: separates what the cap does from the KL."""
    return p3o_loss(logprobs, behavior_logprobs, advantages, mask, cap=False, **kwargs)


@register_loss("p3o_no_kl", ess_scoped=True)
def p3o_no_kl_loss(logprobs, behavior_logprobs, advantages, mask, **kwargs):
    """Ablation of P3O without the KL term: ``ℓ_t = -sg(min(r_t, ESS))·logπθ_t·A_t``.

    Only the ESS cap adapts to the batch; nothing pulls the policy toward the behavior policy."""
    return p3o_loss(logprobs, behavior_logprobs, advantages, mask, behavior_kl=False, **kwargs)
