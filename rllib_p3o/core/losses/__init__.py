"""Losses by name: the registry the learner, the config's validation and the examples' ``--loss`` choices read.

A loss is one module of this package (found at import: a new file here is a new loss, nothing else to edit): its
formula as a small pure-torch function with the formula and gradient in its docstring, its settings dataclass, its
registration, and what it needs from the learner (`OldLogprobs`). Registered:

    p3o          -sg(min(r, ESS))·logπθ·A + (1 - ESS)·K(πθ, π_a)                 (the paper's objective; K, π_a and the
                                                                               trust region on lagging tokens:
                                                                               kl_estimator, kl_anchor, trust_region)
    p3o_no_cap   -sg(r)·logπθ·A           + (1 - ESS)·K(πθ, π_a)                 (ablation: no ESS cap)
    p3o_no_kl    -sg(min(r, ESS))·logπθ·A                                        (ablation: no ESS-weighted KL)
    p3o_reference  p3o as the paper's code: k3 clamped at ±10 toward π_b, one ESS per batch, no trust region
    grpo         -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)                         (PPO-clip baseline; clip_low, clip_high)
    grpo_tis     -min(π_old/π_b, C)·min(ρ·A, clip(ρ, 1-ε_low, 1+ε_high)·A), ρ = πθ/π_old   (truncated IS; + tis_cap)
    grpo_seq_mask  the same without weights, sequences outside a geometric-mean band dropped   (+ seq_mask_low/high)
    cispo        -sg(clip(r, 1-ε_low, 1+ε_high))·logπθ·A                         (MiniMax-M1; clip_low, clip_high)
    p3o_proximal -sg(min(r, c))·logπθ·A + (1 - c)·K(πθ, π_mix)                   (FeynRL's P4O; c = min of 2 ESS)
    m2po         -m·r·A, m: tokens kept under a second-moment bound on log r        (M2PO; m2_threshold)
    decoupled_ppo -1[w ≤ C]·w·min(ρ·A, clip(ρ)·A), w = π_old/π_b, ρ = πθ/π_old     (AReaL; + behavior_weight_cap)

The shared pieces: `rllib_p3o.core.losses.parts` (token means, diagnostics), `rllib_p3o.core.losses.kl_estimators`
(P3O's KL term), `rllib_p3o.core.losses.trust_region` (masks on lagging tokens). How to add a loss:
`rllib_p3o.core.losses.registry` and CONTRIBUTING.md.
"""

import importlib
import pkgutil

from rllib_p3o.core.losses.registry import (
    LOSSES,
    LossInputs,
    LossOutput,
    LossSpec,
    NoSettings,
    OldLogprobs,
    get_loss,
    register_loss,
)

# The package's modules that register no loss: the registry and the pieces the losses share.
SHARED_MODULES = ("registry", "parts", "kl_estimators", "trust_region")

__all__ = ["LOSSES", "LossInputs", "LossOutput", "LossSpec", "NoSettings", "OldLogprobs", "get_loss", "register_loss"]

# Every other module of this package registers its losses when imported.
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in SHARED_MODULES:
        importlib.import_module(f"{__name__}.{_module.name}")
