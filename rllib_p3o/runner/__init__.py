"""Code that runs in the EnvRunner actors: the vLLM engine, prompt environments and rollouts.

Nothing here imports the driver's modules (`rllib_p3o.p3o`, `rllib_p3o.driver`, ...): `tests/test_layout.py` checks
it."""
