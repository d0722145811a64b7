"""reasoning-gym's procedural tasks as prompt datasets, scored by each task's own verifier (the ``envs`` extra).

reasoning-gym generates its tasks from a seed, nothing is downloaded. `reasoning_gym_dataset` turns ``size``
generated entries of one task into prompt rows; `reasoning_gym_reward` scores completions with that task's
``score_answer``, on the very entry the prompt came from (regenerated in the runner from the task's name, its
configuration and the row's index: the generators are deterministic, and the row's ``answer`` is compared with the
regenerated one so that a runner with another reasoning-gym version fails loudly instead of scoring wrong answers).

    from rllib_p3o.envs.reasoning_gym_tasks import reasoning_gym_dataset, reasoning_gym_reward

    config.environment(
        env_config={
            "dataset": reasoning_gym_dataset("basic_arithmetic", size=5000, seed=1, max_terms=3),
            "eval_dataset": reasoning_gym_dataset("basic_arithmetic", size=200, seed=2, max_terms=3),
            "reward_fn": reasoning_gym_reward,
        }
    )

Several tasks: concatenate their rows (each row names its own task), instead of reasoning-gym's ``composite``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, List, Optional, Sequence

from rllib_p3o.data.datasets import Row

# The row columns the reward reads (besides ``answer``): which task and configuration, and which entry of it.
TASK_COLUMN = "reasoning_gym_task"
INDEX_COLUMN = "reasoning_gym_index"
DEFAULT_SYSTEM_PROMPT = "default"


def _create(name: str, config: Dict[str, Any]) -> Any:
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - the envs extra is part of `make install`
        raise ImportError("reasoning-gym is not installed: pip install 'rllib-p3o[envs]'") from e
    try:
        return reasoning_gym.create_dataset(name, **config)
    except Exception as e:
        raise ValueError(f"reasoning-gym cannot create task {name!r} with {config}: {type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=64)
def _task(spec: str) -> Any:
    """The dataset object a row's task column describes, built once per process (it is deterministic)."""
    parsed = json.loads(spec)
    return _create(parsed["name"], parsed["config"])


def reasoning_gym_dataset(
    task: str,
    size: int = 1000,
    seed: int = 0,
    *,
    system_prompt: Optional[str] = DEFAULT_SYSTEM_PROMPT,
    chat: bool = True,
    **task_config: Any,
) -> List[Row]:
    """``size`` entries of reasoning-gym task ``task`` (generated from ``seed``) as prompt rows.

    ``task_config``: the task's own difficulty knobs (e.g. ``max_terms=3`` for ``basic_arithmetic``); an unknown
    one is an error naming the task. ``chat=True`` gives conversational prompts: ``system_prompt`` (a name of
    ``reasoning_gym.utils.SYSTEM_PROMPTS``, which ask for the answer in ``<answer>...</answer>``, or the text of a
    prompt of your own; None for none) then the question as the user's message. ``chat=False`` gives the question
    as a plain string (for models without a chat template). Each row also holds ``answer`` (the reference) and the
    columns `reasoning_gym_reward` reads.
    """
    if size < 1:
        raise ValueError(f"reasoning_gym_dataset: size must be >= 1, got {size}")
    config = {**task_config, "seed": int(seed), "size": int(size)}
    dataset = _create(task, config)
    try:  # what a runner rebuilds the same task from (the generators are deterministic given these)
        spec = json.dumps({"name": task, "config": config}, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"reasoning_gym_dataset({task!r}): the task's settings must be JSON values: {e}") from e
    system = None
    if chat and system_prompt is not None:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        system = SYSTEM_PROMPTS.get(system_prompt, system_prompt)
    rows = []
    for index in range(size):
        entry = dataset[index]
        question = entry["question"]
        if chat:
            prompt: Any = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": question}
            ]
        else:
            prompt = question
        rows.append({"prompt": prompt, "answer": str(entry["answer"]), TASK_COLUMN: spec, INDEX_COLUMN: index})
    return rows


def extract_answer(text: str) -> str:
    """The answer in a completion: the last ``<answer>...</answer>`` (reasoning-gym's format), else the whole text,
    stripped (so that prompts without the format instructions are scored too; add a format reward to demand it)."""
    from reasoning_gym.utils import extract_answer as tagged

    found = tagged(text)
    return found if found is not None else text.strip()


def reasoning_gym_reward(
    completions: Sequence[Any],
    reasoning_gym_task: Sequence[str],
    reasoning_gym_index: Sequence[int],
    answer: Optional[Sequence[Any]] = None,
    **kwargs: Any,
) -> List[float]:
    """Each completion scored by its task's ``score_answer`` on the entry its prompt was generated from (reasoning-gym
    scores in [0, 1]; most tasks give 1.0 for a right answer, some give partial credit)."""
    from rllib_p3o.envs.math_rewards import completion_text

    rewards = []
    for i, (completion, spec, index) in enumerate(zip(completions, reasoning_gym_task, reasoning_gym_index)):
        dataset = _task(spec)
        entry = dataset[int(index)]
        if answer is not None and str(entry["answer"]) != str(answer[i]):
            raise ValueError(
                f"reasoning-gym task {spec} entry {index}: the row's answer {answer[i]!r} is not the regenerated "
                f"{entry['answer']!r}; the rows were made with another reasoning-gym version than this process's"
            )
        rewards.append(float(dataset.score_answer(extract_answer(completion_text(completion)), entry)))
    return rewards
