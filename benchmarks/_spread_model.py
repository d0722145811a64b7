"""A model whose completions end at spread lengths, for benchmarks at realistic lengths (shared by `iteration.py`,
`peer_trl.py` and `bucket_call_cost.py`).

A randomly initialized model emits EOS with probability about 1/V at every step, so with a small vocabulary nearly
every completion runs to the limit, and with ``ignore_eos`` all do: every row of a batch has the same length, which
is not what users' batches look like. This model's completions have geometric lengths instead: after each token it
ends with probability ``p = 1 / mean_tokens``, so a batch capped at ``max_tokens`` holds many short completions, some
long ones and a share ``(1 - p) ** max_tokens`` at the limit (mean 81 and 37% at the limit for mean 128 and cap 128).

How: a Qwen2 of the given size (`SIZES` of `_bench_settings.py`) whose layers' output projections (``o_proj``,
``down_proj``) are zero, so every position's hidden state is its own token's embedding, and whose untied LM head
reads one fixed coordinate of the normalized embedding: 0 for every digit, ``log(10 p / (1 - p))`` for EOS, -30 for
every other token. Every next-token distribution is then "a uniform digit, or EOS with probability p", whatever the
prefix. The model still computes every matrix product of its size (zeros cost as much as any other weights), so
generation and training cost what the size says, and its weights move once training starts (lengths drift slowly).
"""

from __future__ import annotations

import json
import math
import os

from _bench_settings import SIZES, task_rows

OTHER_TOKEN_LOGIT = -30.0


def build_spread_model(path: str, size: str, mean_tokens: float, max_position_embeddings: int = 1024) -> str:
    """Write the model described in the module docstring to ``path`` (reused when built with the same settings)."""
    import torch

    from rllib_p3o.tasks.tiny_model import build_tiny_model

    settings = {"size": size, "mean_tokens": mean_tokens, "max_position_embeddings": max_position_embeddings, "v": 2}
    stamp = os.path.join(path, "spread_model.json")
    if os.path.exists(stamp) and json.load(open(stamp)) == settings:
        return path
    corpus = [f"{r['prompt']}{r['answer']}" for r in task_rows()]
    build_tiny_model(
        path,
        corpus,
        overwrite=True,
        tie_word_embeddings=False,
        max_position_embeddings=max_position_embeddings,
        **SIZES[size],
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = lm.model.embed_tokens.weight  # [V, d]: coordinate 0 the same for every token, the rest of equal norm
        rest = emb[:, 1:]
        zero = rest.norm(dim=1) == 0  # the padding token's row is initialized to zeros
        rest[zero] = torch.randn(int(zero.sum()), rest.shape[1], generator=torch.Generator().manual_seed(0))
        rest.mul_(1.0 / rest.norm(dim=1, keepdim=True))
        emb[:, 0] = 1.0
        d = emb.shape[1]
        normalized_0 = 1.0 / math.sqrt(2.0 / d)  # coordinate 0 after RMSNorm: 1 / rms([1, unit vector])
        p = 1.0 / mean_tokens
        digits = [tok.convert_tokens_to_ids(str(i)) for i in range(10)]
        logits = torch.full((emb.shape[0],), OTHER_TOKEN_LOGIT)
        logits[digits] = 0.0
        logits[tok.eos_token_id] = math.log(10 * p / (1 - p))
        head = lm.lm_head.weight
        head.zero_()
        head[:, 0] = logits / (normalized_0 * lm.model.norm.weight[0])
    lm.save_pretrained(path)
    with open(stamp, "w") as f:
        json.dump(settings, f)
    return path


def build_length_model(size: str, max_tokens: int, models_dir: str) -> str:
    """The spread-length Qwen2 of this size (mean length ``max_tokens``) under ``models_dir``."""
    return build_spread_model(os.path.join(models_dir, f"{size}_mean{max_tokens}"), size, mean_tokens=max_tokens)
