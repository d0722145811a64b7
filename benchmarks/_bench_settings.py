"""The setting the CPU benchmarks share, first measured against TRL in `peer_trl.py` and reused at one length by
`iteration.py --max-tokens`, `lora.py`, `probe_cost.py` and `startup.py`: the task "A+B=" with single digits (and
its reward), 8 prompts x 8 completions per step, lr 1e-4, and randomly initialized Qwen2 models of three sizes.
"""

from __future__ import annotations

import os
from typing import Dict, List

PROMPTS_PER_STEP, GROUP_SIZE, LR = 8, 8, 1e-4
# The completion limit of the benchmarks that reuse this setting at one length (lora.py, probe_cost.py, startup.py).
MAX_TOKENS = 16
# name -> build_tiny_model arguments (head_dim 64 for vLLM's CPU attention).
SIZES: Dict[str, dict] = {
    "0.33M": dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256),
    "2.44M": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=1, intermediate_size=576),
    "10M": dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=1152),
}


def task_rows() -> List[Dict[str, str]]:
    """Prompts "A+B=" with single digits, and their answers (the peer benchmark's task)."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]


def sum_reward(prompts, completions, answer, **_) -> List[float]:
    """1.0 when the completion starts with the sum (TRL's and this project's batched reward signature)."""
    return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]


def build_model(size: str, models_dir: str) -> str:
    """The randomly initialized Qwen2 of this size (`SIZES`) with the task's tokenizer, under ``models_dir``."""
    from rllib_p3o.tasks.tiny_model import build_tiny_model

    corpus = [f"{r['prompt']}{r['answer']}" for r in task_rows()]
    return build_tiny_model(os.path.join(models_dir, size), corpus, overwrite=True, **SIZES[size])
