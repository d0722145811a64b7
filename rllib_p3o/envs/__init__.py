"""Environment adapters: other projects' environments and verifiers as P3O's datasets, rewards and multi-turn
environments, each with the small local environment its tests and examples run.

    verifiers_tasks, verifiers_env   a `verifiers` environment: its tasks as prompt rows, its episode as a
                                     `MultiTurnEnv` with the policy as one seat (verifiers_modsum*: local tasksets)
    openenv_env                      an OpenEnv environment served over HTTP/WebSocket (openenv_modsum: a local one)
    reasoning_gym_tasks              reasoning-gym datasets and their scoring as a reward function
    math_rewards                     math-verify's answer check as a reward function

An adapter turns the other project's objects into the three things P3O consumes: prompt rows (`rllib_p3o.data`), a
reward function (TRL's signature) and, for multi-turn work, a `rllib_p3o.runner.multiturn.MultiTurnEnv` subclass
that the runners build by import path. CONTRIBUTING.md, "Adding an environment", is the recipe.
"""
