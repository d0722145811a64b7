"""The P3O config every built-in task trains with on 2 CPU cores: one vLLM runner, a local learner, 64 prompts × 8
completions per iteration, the demo's lr warm-up, held-out evaluation every 5 iterations on 200 held-out prompts.
The demo (`rllib_p3o.tasks.demo_config`) and the claims bench's tasks (`rllib_p3o.tasks.bench_config`) differ from it
only in what they set on top."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from rllib_p3o.p3o import P3OConfig

# What every built-in task's run shares (`task_config`); a task's own settings and the caller's go over it.
TASK_DEFAULTS: Dict[str, Any] = dict(
    loss="p3o",
    group_size=8,
    prompts_per_step=64,
    # Linear warm-up over the first 10 iterations (5120 sampled completions): Adam's first steps move every weight by
    # ~lr, which at full lr can wreck a small model before any learning happens.
    lr=[[0, 1e-5], [5120, 5e-4]],
    eval_interval=5,
    eval_max_prompts=200,
)


def task_config(
    model_path: str,
    train_rows: List[Dict[str, Any]],
    heldout_rows: List[Dict[str, Any]],
    reward_fn: Callable[..., List[float]],
    **training: Any,
) -> P3OConfig:
    """`TASK_DEFAULTS` with ``training`` over them, on the task's rows and reward, seed 0."""
    return (
        P3OConfig()
        .environment(env_config={"dataset": train_rows, "eval_dataset": heldout_rows, "reward_fn": reward_fn})
        .training(**{**TASK_DEFAULTS, "model": model_path, **training})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
    )
