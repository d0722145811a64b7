"""Environments and rewards from other stacks, a few iterations of P3O each, on a tiny model built here (no download).

    python examples/environments.py reasoning-gym   # reasoning-gym's chain_sum, scored by its verifier + math-verify
    python examples/environments.py openenv         # an OpenEnv server (the modsum game) that the runner starts
    python examples/environments.py reward-models   # a classifier and a vLLM judge in actors, beside a rule reward
    python examples/environments.py verifiers       # a multi-turn verifiers environment (the modsum game of tries)
    python examples/environments.py verifiers-single   # a verifiers taskset, one answer per task

Each prints one line per iteration (reward, tokens trained). The tiny model is random, so the point is the wiring:
swap in your model, task and environment (docs/guide/environments.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile


def reasoning_gym_config(out: str):
    from rllib_p3o import P3OConfig
    from rllib_p3o.envs.math_rewards import math_verify_reward
    from rllib_p3o.envs.reasoning_gym_tasks import reasoning_gym_dataset, reasoning_gym_reward
    from rllib_p3o.tasks import build_tiny_model

    # String prompts (chat=False): the tiny model has no chat template. A chat model takes the default, chat=True.
    rows = reasoning_gym_dataset("chain_sum", size=200, seed=0, chat=False, min_terms=2, max_terms=2, max_digits=1)
    model = build_tiny_model(os.path.join(out, "tiny_rg"), [r["prompt"] + " " + r["answer"] for r in rows] * 5)
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": rows,
                "reward_fn": [reasoning_gym_reward, math_verify_reward],
                "reward_weights": [1.0, 0.5],
            }
        )
        .training(model=model, group_size=4, prompts_per_step=8, max_tokens=3)
    )


def openenv_config(out: str):
    from rllib_p3o import P3OConfig
    from rllib_p3o.envs.openenv_env import OpenEnvEnv
    from rllib_p3o.envs.openenv_modsum import MAX_TRIES

    model = _tiny_chat_model(out)
    rows = [{"prompt": [{"role": "system", "content": "add"}], "reset_kwargs": {"seed": s}} for s in range(100)]
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": rows,
                "multi_turn_env": OpenEnvEnv,
                # Each runner serves the app on 127.0.0.1 (or "url": a server already running).
                "openenv": {"app": "rllib_p3o.envs.openenv_modsum:app", "reset_column": "reset_kwargs"},
                "max_turns": MAX_TRIES,
                "stop_tokens": ["<|im_end|>"],
            }
        )
        .training(model=model, group_size=4, prompts_per_step=8, max_tokens=4)
    )


def reward_models_config(out: str):
    from rllib_p3o import P3OConfig
    from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward, build_tiny_model
    from rllib_p3o.tasks.tiny_model import build_tiny_reward_model

    policy = build_tiny_model(os.path.join(out, "tiny"))
    classifier = build_tiny_reward_model(os.path.join(out, "tiny_rm"), policy)  # a sequence classifier, one logit
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": ArithmeticTask().train_rows(),
                "reward_fn": arithmetic_reward,  # a rule, then one weight per reward model
                "reward_models": [
                    {"model": classifier, "kind": "classifier", "name": "quality", "score": "sigmoid"},
                    # The policy's own tiny model as a judge (vLLM in its actor); its tokenizer has digits, no "yes".
                    {"model": policy, "kind": "judge", "name": "judge", "yes": "1", "no": "0"},
                ],
                "reward_weights": [1.0, 0.2, 0.2],
            }
        )
        .training(model=policy, group_size=4, prompts_per_step=8, max_tokens=4)
    )


def _tiny_chat_model(out: str) -> str:
    from rllib_p3o.tasks import ArithmeticTask, build_tiny_model
    from rllib_p3o.tasks.tiny_model import CHAT_TEMPLATE, CHAT_TOKENS

    return build_tiny_model(
        os.path.join(out, "tiny_chat"),
        ArithmeticTask().corpus() + ["system user assistant add"] * 10,
        vocab_size=80,
        special_tokens=CHAT_TOKENS,
        chat_template=CHAT_TEMPLATE,
    )


def verifiers_config(out: str, multi_turn: bool = True):
    from rllib_p3o import P3OConfig
    from rllib_p3o.envs.verifiers_env import VerifiersEnv
    from rllib_p3o.envs.verifiers_modsum_game import MAX_TRIES
    from rllib_p3o.envs.verifiers_tasks import verifiers_dataset

    # verifiers' EnvConfig: a taskset (an installed package's name, or a dotted module path) and, for the game, the
    # Env that plays it as an exchange of tries.
    vf_env = {"taskset": {"id": "rllib_p3o.envs.verifiers_modsum", "size": 200}}
    if multi_turn:
        vf_env["id"] = "rllib_p3o.envs.verifiers_modsum_game"
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": verifiers_dataset(vf_env),
                "multi_turn_env": VerifiersEnv,
                "max_turns": MAX_TRIES,
                "stop_tokens": ["<|im_end|>"],
            }
        )
        .training(model=_tiny_chat_model(out), group_size=4, prompts_per_step=8, max_tokens=4)
    )


CONFIGS = {
    "reasoning-gym": reasoning_gym_config,
    "openenv": openenv_config,
    "reward-models": reward_models_config,
    "verifiers": verifiers_config,
    "verifiers-single": lambda out: verifiers_config(out, multi_turn=False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env", choices=list(CONFIGS))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", default=None, help="where the tiny model is built (default: a temporary folder)")
    args = parser.parse_args()
    import logging

    import ray

    from rllib_p3o.core import metrics as m
    from rllib_p3o.driver.progress import silence_driver_and_workers

    out = args.out or tempfile.mkdtemp(prefix="rllib_p3o_envs_")
    env_vars = silence_driver_and_workers()
    config = CONFIGS[args.env](out)
    ray.init(  # the driver, a runner, a learner and a CPU per reward model
        num_cpus=6, include_dashboard=False, logging_level=logging.ERROR, runtime_env={"env_vars": env_vars}
    )
    algo = config.env_runners(num_env_runners=1).debugging(seed=0).build_algo()
    try:
        for _ in range(args.iterations):
            result = algo.train()
            p3o = result[m.P3O]
            print(
                f"iteration {result['training_iteration']}: reward {p3o[m.REWARD_MEAN]:.3f} "
                f"{ {k: round(float(v), 3) for k, v in p3o.get(m.REWARDS, {}).items()} } "
                f"tokens trained {p3o[m.TRAINED_TOKENS]:.0f}"
            )
    finally:
        algo.stop()
        ray.shutdown()


if __name__ == "__main__":
    main()
