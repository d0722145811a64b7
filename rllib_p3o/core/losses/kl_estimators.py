"""Per-token estimators of ``KL(πθ ‖ π_a)`` from tokens that another policy, ``π_b``, sampled.

P3O's trust-region term is ``(1 - ESS) · KL(πθ ‖ π_a)``, where the anchor ``π_a`` is the behavior policy ``π_b``
(the paper's form) or the learner's weights at the start of the iteration (``kl_anchor="proximal"``). The tokens of
the batch come from ``π_b``, not from ``πθ``, so which per-token function is averaged decides which divergence the
term actually minimizes. Registered by name (``loss_config={"kl_estimator": NAME}`` of the P3O losses)::

    k3          K(l) = l + exp(-l) - 1,  l = logπθ - logπ_a      (tails past |l| > 10 continued linearly)
    k3_clamped  K(l) = l + exp(clamp(-l, -10, 10)) - 1             (the paper's reference implementation, FeynRL)
    k3_is       w_a · (1 - s + s·log s),  s = πθ/π_a,  w_a = π_a/π_b      (exactly KL(πθ ‖ π_a) in expectation)

All three are 0 where ``πθ = π_a`` and agree to second order around it when ``π_a = π_b`` (on-policy data).

Every function takes ``logprobs`` (log πθ of the sampled tokens, with gradient), ``anchor_logprobs`` (log π_a) and
``behavior_logprobs`` (log π_b), all ``[B, T]`` and all but the first without gradient, and returns the per-token
value ``[B, T]``. This module imports only torch.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch

# |log-ratio| beyond which an estimator is continued linearly (`kl_k3`, `kl_k3_is`) or its exponent clamped
# (`kl_k3_clamped`): exp(10) ≈ 2.2e4 bounds a token's gradient.
KL_LOG_RATIO_CLIP = 10.0

KLEstimator = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Dict[str, KLEstimator] = {}


def _register(name: str) -> Callable[[KLEstimator], KLEstimator]:
    def register(fn: KLEstimator) -> KLEstimator:
        KL_ESTIMATORS[name] = fn
        return fn

    return register


def kl_k3(logprobs: torch.Tensor, other_logprobs: torch.Tensor, clip: float = KL_LOG_RATIO_CLIP) -> torch.Tensor:
    """Per-token k3 ``K(l) = l + exp(-l) - 1`` with ``l = logπ - logπ_other`` (Schulman's low-variance estimator of
    ``KL(π ‖ π_other)`` *for tokens sampled from π*).

    ``K ≥ 0``, ``K(0) = 0``, ``dK/dl = 1 - exp(-l)``: minimizing K always pulls ``logπ`` toward ``logπ_other``.
    Expectation under samples from π: ``KL(π ‖ π_other)``. Under samples from ``π_other`` instead (P3O's batch when
    ``π_other = π_b``) it is ``E_b[1/s - 1 + log s] = χ²(π_b ‖ π) - KL(π_b ‖ π)`` with ``s = π/π_b``: a
    mass-covering pull toward π_b whose per-token gradient ``(1 - 1/s)·∇logπ`` grows without bound on a token π
    rejects (s → 0).

    For ``|l| > clip`` the function is continued linearly with the slope it has at ``±clip``: value and gradient stay
    finite and, unlike clamping the exponent (`kl_k3_clamped`), the gradient never flips its sign. Within
    ``[-clip, clip]`` it is exactly k3. Gradients flow into whichever argument requires grad.
    """
    log_ratio = logprobs - other_logprobs
    lc = log_ratio.clamp(-clip, clip)
    k_at = lc + torch.exp(-lc) - 1.0
    slope = (1.0 - torch.exp(-lc)).detach()
    # Inside the range (l == lc) the second term is 0 and the value is exact with autograd's own gradient.
    return k_at + slope * (log_ratio - lc)


@_register("k3")
def k3(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor) -> torch.Tensor:
    """`kl_k3` of ``logπθ - logπ_a`` (``behavior_logprobs`` unused): the plain k3, tails continued linearly."""
    return kl_k3(logprobs, anchor_logprobs)


@_register("k3_clamped")
def k3_clamped(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor) -> torch.Tensor:
    """The paper's reference implementation (FeynRL ``compute_kl_distance``), exactly::

        K(l) = l + exp(clamp(-l, -10, 10)) - 1,   l = logπθ - logπ_a

    Equal to `kl_k3` for ``|l| ≤ 10``. Past it the exponent is constant, so the slope is +1 on both sides: for
    ``l < -10`` (a token πθ has rejected) minimizing it pushes ``logπθ`` further *down*, away from the anchor.
    Expectation and gradient inside the range as `kl_k3`.
    """
    log_ratio = logprobs - anchor_logprobs
    return log_ratio + torch.exp((-log_ratio).clamp(-KL_LOG_RATIO_CLIP, KL_LOG_RATIO_CLIP)) - 1.0


@_register("k3_is")
def k3_is(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor) -> torch.Tensor:
    """Importance-sampled k3: an unbiased estimate of ``KL(πθ ‖ π_a)`` from tokens sampled by ``π_b``.

    With ``r = πθ/π_b`` (carrying gradient), ``s = πθ/π_a`` and the constant ``w_a = π_a/π_b = r/s``::

        K = w_a · (1 - s + s·log s) = w_a - r + r·log s
        E_b[K] = Σ_y π_a - Σ_y πθ + Σ_y πθ·log(πθ/π_a) = KL(πθ ‖ π_a)          (exact, wherever π_b covers πθ)
        ∂K/∂logπθ = r · log s

    With the anchor at the behavior policy (``w_a = 1``) this is ``1 - r + r·log r``. ``K ≥ 0`` per token
    (``w_a · f(s)`` with ``f`` convex, ``f(1) = 0``); the gradient's weight on a token πθ has rejected is at most
    ``1/e`` (``r·log r`` on ``r < 1``) and vanishes as ``r → 0``: a weaker behavior model's tokens cannot pull the
    learner back toward them. To first order around ``πθ = π_a = π_b`` it equals k3 (both ``½ l²``).

    For ``log r > clip`` the function is continued linearly in ``logπθ`` with the slope it has there, so no
    ratio overflows.
    """
    l_b = logprobs - behavior_logprobs
    l_a = logprobs - anchor_logprobs
    w_a = torch.exp((anchor_logprobs - behavior_logprobs).detach())
    lc = l_b.clamp(max=KL_LOG_RATIO_CLIP)
    beyond = l_b - lc  # > 0 only past the clip, where it carries logπθ's gradient instead of lc
    r_c = torch.exp(lc)
    la_c = l_a - beyond
    k_at = w_a - r_c + r_c * la_c
    slope = (r_c * la_c).detach()
    return k_at + slope * beyond


def get_kl_estimator(name: str) -> KLEstimator:
    """The estimator registered as ``name``; a ValueError lists the names otherwise."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {name!r}; choose one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]
