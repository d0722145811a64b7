"""A fused LM head for token log-probs: ``log π(target)`` straight from the final hidden states and the head's weight,
token chunk by token chunk, never holding the [N, V] logits (or their gradient) of all tokens at once.

`fused_token_logprobs` computes, for hidden states ``h`` [N, H], the head's weight ``W`` [V, H] (and bias ``b`` [V])
and target ids ``y`` [N]::

    x = h Wᵀ + b,    z = cap · tanh(x / cap)  (the logit soft-cap, where one is given; else z = x)
    logp(y) = z_y − logsumexp_{v ∈ S} z_v

with ``S`` the whole vocabulary, or the row's kept set ``K`` where ``kept_ids`` gives one (top-k/top-p sampling: the
same semantics as `rllib_p3o.learner.compute.kept_set_log_mass`: negative ids are padding, a row whose first id is
`KEPT_OVERFLOW` or whose ids are all padding has no set, and its log-prob is the full distribution's; an id listed
twice counts twice, as there). Gradient, with ``g`` the upstream gradient of ``logp`` [N]::

    ∂logp/∂z_v = 1[v = y] − Σ_{j: K_j = v} q_j,    q_j = softmax_j(z_{K_j})          (rows with a kept set)
    ∂logp/∂z_v = 1[v = y] − softmax(z)_v                                             (rows without)
    ∂logp/∂x = ∂logp/∂z · (1 − tanh²(x / cap))                                      (soft-cap)
    ∂L/∂h = (g · ∂logp/∂x) W,    ∂L/∂W = (g · ∂logp/∂x)ᵀ h,    ∂L/∂b = Σ_t g_t ∂logp_t/∂x_t

**Memory and compute** (the choice between storing gradients in the forward and recomputing in the backward): the
gradient is linear in ``g`` token by token, so ``∂L/∂h`` can be computed in the forward with ``g = 1`` and scaled in
the backward (an extra [N, H], small); ``∂L/∂W`` cannot: ``Σ_t g_t (∂logp_t/∂x_t) ⊗ h_t`` needs each token's
[V]-sized ``∂logp/∂x`` weighted by a ``g_t`` known only in the backward, and storing those is the [N, V] this avoids.
Hence a hybrid:

- the head's weight (or bias) trainable: the forward computes log-probs chunk by chunk and keeps only its inputs;
  the backward recomputes each chunk's logits and builds ``∂L/∂h``, ``∂L/∂W`` and ``∂L/∂b`` from them (4 matmuls
  of [chunk, H] × [H, V] per chunk in all, as under today's activation checkpointing);
- the head frozen (LoRA that leaves the head out): the forward also computes ``∂logp/∂h`` and keeps it ([N, H], float32);
  the backward only scales it by ``g`` (2 matmuls per chunk instead of 3, no recomputation).

Either way the largest intermediates are [chunk_tokens, V] float32 (one, or two with a soft-cap), plus the float32
accumulator of ``∂L/∂W`` [V, H] when the weight is trainable (as Liger's fused linear cross-entropy).

**Precision**: the logits are computed in the inputs' dtype (under autocast: its dtype, as ``nn.Linear`` would) and
everything after in float32, as `rllib_p3o.learner.compute.head_from_logits`; the log-probs come back in float32.
Without grad mode (or with nothing requiring grad) the forward stores nothing. Pure torch: no Ray.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from rllib_p3o.core.columns import KEPT_OVERFLOW

# Tokens per chunk: the [chunk, V] float32 logits of Qwen's vocabulary (151,936) at 1024 tokens are 0.62 GB.
DEFAULT_CHUNK_TOKENS = 1024


def fused_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    kept_ids: Optional[torch.Tensor] = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """``log π(targets)`` [N] float32 from ``hidden`` [N, H] and the LM head ``weight`` [V, H] (``bias`` [V]),
    renormalized over each row's kept set ``kept_ids`` [N, W] where given; see the module docstring for the formula,
    its gradient and the memory it needs. ``softcap``: the logit soft-cap (``final_logit_softcapping``; None or 0:
    none). Differentiable in ``hidden``, ``weight`` and ``bias`` (once: no double backward)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets [N] expected, got {tuple(targets.shape)} for N = {hidden.shape[0]}")
    if kept_ids is not None and (kept_ids.dim() != 2 or kept_ids.shape[0] != hidden.shape[0]):
        raise ValueError(f"kept_ids [N, W] expected, got {tuple(kept_ids.shape)}")
    if int(chunk_tokens) < 1:
        raise ValueError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
    targets = targets.long()
    if kept_ids is not None:
        kept_ids = kept_ids.long() if kept_ids.shape[1] else None
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):  # the head's matmul in autocast's dtype, as nn.Linear would run it
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    elif hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) differ in dtype")
    cap = float(softcap) if softcap else None
    inputs = (hidden, weight) + (() if bias is None else (bias,))
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    with torch.autocast(device_type, enabled=False):
        if not wants_grad:
            return _forward(hidden, weight, bias, targets, kept_ids, int(chunk_tokens), cap, eager_grad=False)[0]
        return _FusedTokenLogprobs.apply(hidden, weight, bias, targets, kept_ids, int(chunk_tokens), cap)


class _FusedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, kept_ids, chunk_tokens, cap):
        head_trains = weight.requires_grad or (bias is not None and bias.requires_grad)
        eager = hidden.requires_grad and not head_trains
        logp, grad_hidden = _forward(hidden, weight, bias, targets, kept_ids, chunk_tokens, cap, eager)
        ctx.chunk_tokens, ctx.cap, ctx.eager, ctx.has_bias = chunk_tokens, cap, eager, bias is not None
        ctx.has_kept, ctx.hidden_dtype = kept_ids is not None, hidden.dtype
        if eager:
            ctx.save_for_backward(grad_hidden)
        else:
            kept = kept_ids if kept_ids is not None else targets.new_empty(0)
            ctx.save_for_backward(hidden, weight, bias if bias is not None else weight.new_empty(0), targets, kept)
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp):
        g = grad_logp.float()
        if ctx.eager:
            (grad_hidden,) = ctx.saved_tensors
            return (grad_hidden * g[:, None]).to(ctx.hidden_dtype), None, None, None, None, None, None
        hidden, weight, bias, targets, kept_ids = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        kept_ids = kept_ids if ctx.has_kept else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], ctx.chunk_tokens):
            e = min(s + ctx.chunk_tokens, hidden.shape[0])
            h = hidden[s:e]
            z, tanh = _logits(h, weight, bias, ctx.cap)
            kept = None if kept_ids is None else kept_ids[s:e]
            dx = _chunk(z, tanh, targets[s:e], kept, g[s:e])[1]
            if need_h:
                grad_hidden[s:e] = (dx.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_w:
                if h.dtype == torch.float32:
                    grad_weight.addmm_(dx.t(), h)
                else:
                    grad_weight += dx.to(h.dtype).t() @ h
            if need_b:
                grad_bias += dx.sum(0)
            del z, tanh, dx
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cap: Optional[float]
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A chunk's float32 logits ``z`` [n, V] (soft-capped) and, under a soft-cap, ``tanh(x / cap)`` (for the
    gradient); the matmul in the inputs' dtype, as ``nn.Linear``."""
    x = (hidden @ weight.t() if bias is None else torch.addmm(bias, hidden, weight.t())).float()
    if cap is None:
        return x, None
    tanh = x.div_(cap).tanh_()  # in place: x is not needed again
    return tanh * cap, tanh


def _kept_set(kept_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Which entries are ids and which rows have a set (`rllib_p3o.learner.compute.kept_set_log_mass`)."""
    valid = kept_ids >= 0
    return valid, valid.any(-1) & (kept_ids[:, 0] != KEPT_OVERFLOW)


def _chunk(
    z: torch.Tensor,
    tanh: Optional[torch.Tensor],
    targets: torch.Tensor,
    kept_ids: Optional[torch.Tensor],
    g: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A chunk's log-probs [n] from its float32 logits ``z`` [n, V] and, for an upstream gradient ``g`` [n],
    ``g · ∂logp/∂x`` [n, V] (module docstring). In place: ``z``'s storage becomes the gradient (and ``tanh``'s is
    overwritten), so that a chunk needs one [n, V] buffer (two under a soft-cap)."""
    z_target = z.gather(1, targets[:, None])[:, 0]
    if kept_ids is not None:
        valid, has_set = _kept_set(kept_ids)
        z_kept = z.gather(1, kept_ids.clamp(min=0)).masked_fill_(~valid, float("-inf"))
        z_kept = torch.where(has_set[:, None], z_kept, torch.zeros_like(z_kept))  # no set: no all -inf row
        lse_kept = torch.logsumexp(z_kept, dim=-1)
    top = z.amax(dim=-1)
    exp = z.sub_(top[:, None]).exp_()  # exp(z − max), in z's storage
    total = exp.sum(dim=-1)
    logp = z_target - (total.log() + top)
    if kept_ids is not None:
        logp = torch.where(has_set, z_target - lse_kept, logp)
    if g is None:
        return logp, None
    # Rows without a set: −g · softmax(z) = −(g / Σ exp) · exp(z − max); rows with one: none of it.
    full = g / total if kept_ids is None else torch.where(has_set, torch.zeros_like(g), g / total)
    dz = exp.mul_(-full[:, None])
    if kept_ids is not None:  # rows with a set: −g · q_j at each entry j of it (an id listed twice counts twice)
        q = (z_kept - lse_kept[:, None]).exp_().masked_fill_(~(valid & has_set[:, None]), 0.0)
        dz.scatter_add_(1, kept_ids.clamp(min=0), q.mul_(-g[:, None]))
    dz.scatter_add_(1, targets[:, None], g[:, None])
    if tanh is not None:
        dz.mul_(tanh.mul_(tanh).neg_().add_(1.0))  # ∂z/∂x = 1 − tanh²(x / cap)
    return logp, dz


def _forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: torch.Tensor,
    kept_ids: Optional[torch.Tensor],
    chunk_tokens: int,
    cap: Optional[float],
    eager_grad: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs [N] and, with ``eager_grad``, ``∂logp/∂h`` [N, H] in float32 (for an upstream gradient of ones)."""
    n = hidden.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if eager_grad else None
    ones = torch.ones(min(n, chunk_tokens), dtype=torch.float32, device=hidden.device) if eager_grad else None
    for s in range(0, n, chunk_tokens):
        e = min(s + chunk_tokens, n)
        z, tanh = _logits(hidden[s:e], weight, bias, cap)
        kept = None if kept_ids is None else kept_ids[s:e]
        logp[s:e], dx = _chunk(z, tanh, targets[s:e], kept, None if ones is None else ones[: e - s])
        if dx is not None:
            grad_hidden[s:e] = dx.to(weight.dtype) @ weight
        del z, tanh, dx
    return logp, grad_hidden
