"""The claims bench's setting: its tasks (sorting, addition) and the P3O config every bench trial starts from."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.addition import AdditionTask, addition_reward
from rllib_p3o.tasks.sorting import SortingTask, sorting_reward
from rllib_p3o.tasks.task_config import task_config

# Sampled held-out evaluation: the base model's greedy answers are already right on ~0.9 of the held-out lists (the
# right answer is its most likely one), while a sample at T = 1 is right on ~0.3: greedy accuracy would saturate at
# once and hide what RL changes, the probability of the right answer.
EVAL_TEMPERATURE = 1.0
EVAL_SAMPLES_PER_PROMPT = 4
# Completions per iteration (64 prompts x 8), and so the minibatch of one optimizer step per rollout batch.
BENCH_BATCH = 512


# The claims bench's tasks: their rows, verifier and the longest completion they need.
BENCH_TASKS: Dict[str, Tuple[Callable[[], Any], Callable[..., List[float]], int]] = {
    "sorting": (SortingTask, sorting_reward, 16),
    "addition": (AdditionTask, addition_reward, 32),
}


def bench_config(model_path: str, task: str = "sorting", **training: Any) -> P3OConfig:
    """64 prompts x 8 completions per iteration of at most 16 new tokens (the addition task: 32), one optimizer step
    per iteration (the paper's protocol: the minibatch is the whole batch of 512 completions), the demo's lr warm-up,
    and held-out evaluation every 5 iterations as the mean reward of 4 samples at T = 1 per prompt on 200 held-out
    prompts (avg@4)."""
    rows, reward_fn, max_tokens = BENCH_TASKS[task]
    options = {
        "max_tokens": max_tokens,
        "minibatch_size": BENCH_BATCH,
        "eval_temperature": EVAL_TEMPERATURE,
        "eval_samples_per_prompt": EVAL_SAMPLES_PER_PROMPT,
        **training,
    }
    return task_config(model_path, rows().train_rows(), rows().heldout_rows(), reward_fn, **options)


def addition_config(model_path: str, **training: Any) -> P3OConfig:
    """`bench_config` on the addition task (`rllib_p3o.tasks.addition`)."""
    return bench_config(model_path, task="addition", **training)
