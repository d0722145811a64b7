"""Math answers checked with Hugging Face's ``math-verify`` (the ``envs`` extra): a built-in reward function.

``math_verify_reward`` has TRL's batched signature and TRL's ``accuracy_reward`` conventions: the reference answer
comes from the row's ``solution`` column (TRL's name) or its ``answer`` column, both are parsed by math-verify
(LaTeX, ``\\boxed{}``, plain expressions, in that order of preference), and the completion scores 1.0 when the two are
mathematically equal (``1/2``, ``0.5`` and ``\\frac{2}{4}`` all match), else 0.0. A reference that math-verify cannot
parse gives None: the completion is left out of its group's baseline instead of being punished for a bad row.

    config.environment(env_config={"dataset": rows, "reward_fn": "rllib_p3o.envs.math_rewards:math_verify_reward"})
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence

# math-verify bounds parsing and comparison with SIGALRM, which only the main thread may set. Reward functions run
# in the runner's thread that calls them (the main one in a Ray actor, but a Tune trial or a user's thread pool
# need not be): elsewhere they run without that bound rather than fail.
_TIMEOUT_S = 5


def completion_text(completion: Any) -> str:
    """The text to check: a string as it is; for messages (TRL's conversational completions, or a multi-turn
    episode's turns after the prompt) the last assistant message's content."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def _reference_column(n: int, solution: Optional[Sequence[Any]], answer: Optional[Sequence[Any]]) -> Sequence[Any]:
    reference = solution if solution is not None else answer
    if reference is None:
        raise ValueError(
            "math_verify_reward needs a 'solution' (TRL's name) or 'answer' column in the dataset with each prompt's "
            "reference answer"
        )
    if len(reference) != n:  # pragma: no cover - the reward contract passes one value per completion
        raise ValueError(f"math_verify_reward got {len(reference)} reference answers for {n} completions")
    return reference


def math_verify_reward(
    completions: Sequence[Any],
    solution: Optional[Sequence[Any]] = None,
    answer: Optional[Sequence[Any]] = None,
    **kwargs: Any,
) -> List[Optional[float]]:
    """1.0 where math-verify finds the completion's answer equal to the reference (``solution``, else ``answer``),
    0.0 where it does not or finds no answer, None where the reference itself cannot be parsed."""
    from math_verify import parse, verify

    reference = _reference_column(len(completions), solution, answer)
    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    rewards: List[Optional[float]] = []
    for completion, gold_text in zip(completions, reference):
        gold = parse(str(gold_text), parsing_timeout=timeout) if gold_text is not None else []
        if not gold:
            rewards.append(None)
            continue
        predicted = parse(completion_text(completion), parsing_timeout=timeout)
        rewards.append(float(bool(predicted) and verify(gold, predicted, timeout_seconds=timeout)))
    return rewards
