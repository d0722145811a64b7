"""The claims bench's setting: the sorting task, its base model and the P3O config every bench trial starts from."""

from __future__ import annotations

from typing import Any

from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.sorting import SortingTask, sorting_reward

# Sampled held-out evaluation: the base model's greedy answers are already right on ~0.9 of the held-out lists (the
# right answer is its most likely one), while a sample at T = 1 is right on ~0.3: greedy accuracy would saturate at
# once and hide what RL changes, the probability of the right answer.
EVAL_TEMPERATURE = 1.0
EVAL_SAMPLES_PER_PROMPT = 4
# Completions per iteration (64 prompts x 8), and so the minibatch of one optimizer step per rollout batch.
BENCH_BATCH = 512


def bench_config(model_path: str, **training: Any) -> P3OConfig:
    """64 prompts x 8 completions per iteration of at most 16 new tokens, one optimizer step per iteration (the
    paper's protocol: the minibatch is the whole batch of 512 completions), the demo's lr warm-up, and held-out evaluation every 5 iterations as the mean
    reward of 4 samples at T = 1 per prompt on 200 held-out lists (avg@4)."""
    task = SortingTask()
    options = dict(
        model=model_path,
        loss="p3o",
        group_size=8,
        prompts_per_step=64,
        max_tokens=16,
        lr=[[0, 1e-5], [5120, 5e-4]],
        minibatch_size=BENCH_BATCH,
        eval_interval=5,
        eval_max_prompts=200,
        eval_temperature=EVAL_TEMPERATURE,
        eval_samples_per_prompt=EVAL_SAMPLES_PER_PROMPT,
    )
    options.update(training)
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": task.train_rows(),
                "eval_dataset": task.heldout_rows(),
                "reward_fn": sorting_reward,
            }
        )
        .training(**options)
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
