"""The ``env_config`` keys P3O reads, in one list, and the check that names a key nothing reads.

A misspelled key (``reward_func`` for ``reward_fn``) would otherwise be ignored: the run would fail in a runner, after
Ray started, without naming it, or run without the setting. `unknown_key_problem` names it, with the keys it may have
meant, when the config is validated. The configuration reference lists the same keys (``tests/test_first_hour.py``
keeps the two alike). A user's own environment class may read keys of its own: with one, only a key that is nearly
one of these (a misspelling) is refused.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Optional

# Every key P3O's environments, runners and reward contract read (the configuration reference's table).
ENV_CONFIG_KEYS = (
    "dataset",
    "eval_dataset",
    "reward_fn",
    "reward_funcs",  # TRL's name for reward_fn
    "reward_weights",
    "reward_models",
    "stop_tokens",
    "seed",
    "multi_turn_env",
    "max_turns",
    "max_total_tokens",
    "tools",
    "tool_timeout_s",
    "tool_memory_mb",
    "tool_cpu_s",
    "tool_workers",
    "openenv",
)
# Set by RLlib, the runners themselves and the driver (its reward-model actors' names), in each runner's copy.
RUNNER_KEYS = ("worker_index", "num_workers", "vector_index", "remote", "reward_model_actors")
# A key this close to a known one (difflib's ratio) is taken for its misspelling.
MISSPELLING_CUTOFF = 0.75


def unknown_key_problem(env_config: Mapping[str, Any], own_environment: bool = False) -> Optional[str]:
    """What is wrong with ``env_config``'s keys, or None: keys nothing reads, each with the known keys it is nearest
    (difflib). ``own_environment``: a user's environment class that may read keys of its own; then only keys that are
    nearly a known one, which is not given, are refused."""
    known = set(ENV_CONFIG_KEYS) | set(RUNNER_KEYS)
    problems = []
    for key in env_config:
        if key in known or not isinstance(key, str):
            continue
        near = difflib.get_close_matches(key, ENV_CONFIG_KEYS, n=2, cutoff=0.6)
        misspelled = [
            k
            for k in near
            if k not in env_config and difflib.SequenceMatcher(None, key, k).ratio() >= MISSPELLING_CUTOFF
        ]
        if own_environment and not misspelled:
            continue
        hint = f" (did you mean {' or '.join(repr(k) for k in near)}?)" if near else ""
        problems.append(f"{key!r}{hint}")
    if not problems:
        return None
    return (
        f"env_config has unknown key(s) {', '.join(problems)}; P3O reads {', '.join(ENV_CONFIG_KEYS)} "
        "(configuration reference, 'env_config keys')."
        + (
            " A key your own environment reads is fine unless it is this close to one of these."
            if own_environment
            else ""
        )
    )
