"""Losses by name: the registry the learner, the config's validation and the examples' ``--loss`` choices read.

Registered (one module each in this package, found at import: a new file here is a new loss, nothing else to edit):

    p3o          -sg(min(r, ESS))·logπθ·A + (1 - ESS)·K(πθ, π_a)                 (the paper's objective; K and π_a:
                                                                               kl_estimator, kl_anchor)
    p3o_no_cap   -sg(r)·logπθ·A           + (1 - ESS)·K(πθ, π_a)                 (ablation: no ESS cap)
    p3o_no_kl    -sg(min(r, ESS))·logπθ·A                                        (ablation: no ESS-weighted KL)
    grpo         -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)                         (PPO-clip baseline; clip_low, clip_high)
    grpo_tis     -min(π_old/π_b, C)·min(ρ·A, clip(ρ, 1-ε_low, 1+ε_high)·A), ρ = πθ/π_old   (truncated IS; + tis_cap)
    grpo_seq_mask  the same without weights, sequences outside a geometric-mean band dropped   (+ seq_mask_low/high)
    cispo        -sg(clip(r, 1-ε_low, 1+ε_high))·logπθ·A                         (MiniMax-M1; clip_low, clip_high)
    p3o_proximal -sg(min(r, c))·logπθ·A + (1 - c)·K(πθ, π_mix)                   (FeynRL's P4O; c = min of 2 ESS)

How to add one: `rllib_p3o.core.losses.registry` and CONTRIBUTING.md.
"""

import importlib
import pkgutil

from rllib_p3o.core.losses.registry import (
    LOSSES,
    LossInputs,
    LossOutput,
    LossSpec,
    NoSettings,
    get_loss,
    register_loss,
)

__all__ = ["LOSSES", "LossInputs", "LossOutput", "LossSpec", "NoSettings", "get_loss", "register_loss"]

# Every module of this package registers its losses when imported.
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")
