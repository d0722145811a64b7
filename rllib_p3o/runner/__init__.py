"""Code that runs in the EnvRunner actors: the vLLM engine, prompt environments, rollouts and episodes.

Nothing here imports the driver's modules (`rllib_p3o.p3o`, `rllib_p3o.sampler`, `rllib_p3o.engine_runners`,
`rllib_p3o.sync.push`, ...): `tests/test_layout.py` checks it."""
