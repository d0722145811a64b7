"""A runner that fails to start raises its own error on the driver, with real Ray and RLlib: a reward function named
by a ``"module:function"`` string, or passed as a function, from a module the driver imports but the runner
processes cannot (its folder is on the driver's sys.path only). RLlib alone would log the runner's error and fail in
``get_spaces`` with ``IndexError: list index out of range``."""

import importlib
import sys

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core.callables import CallableImportError
from rllib_p3o.tasks import ArithmeticTask


@pytest.fixture
def driver_only_module(tmp_path):
    """A module the driver can import and Ray's worker processes cannot (they do not get this sys.path entry)."""
    (tmp_path / "driver_only_rewards.py").write_text(
        "def reward(prompts, completions, **_):\n    return [0.0] * len(completions)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("driver_only_rewards")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("driver_only_rewards", None)


def _build(model, reward_fn):
    return (
        P3OConfig()
        .environment(env_config={"dataset": ArithmeticTask().train_rows()[:8], "reward_fn": reward_fn})
        .training(model=model, group_size=2, prompts_per_step=2, max_tokens=2, eval_interval=0)
        .env_runners(num_env_runners=1)
        .build_algo()
    )


@pytest.mark.slow
def test_a_reward_function_named_by_a_module_the_runners_cannot_import(ray_session, tiny_model, driver_only_module):
    with pytest.raises(CallableImportError) as raised:
        _build(tiny_model, "driver_only_rewards:reward")
    message = str(raised.value)
    assert (
        "env_config['reward_fn'] = 'driver_only_rewards:reward': cannot import module 'driver_only_rewards'" in message
    )
    assert "ModuleNotFoundError" in message and 'runtime_env={"py_modules": [driver_only_rewards]}' in message
    # The runner's own exception, with the runner's traceback: where in its constructor it failed.
    notes = "\n".join(raised.value.__notes__)
    assert "raised in EnvRunner 1 while it started" in notes and "resolve_callable" in notes


@pytest.mark.slow
def test_a_reward_function_whose_module_the_runners_cannot_import(ray_session, tiny_model, driver_only_module):
    with pytest.raises(CallableImportError) as raised:
        _build(tiny_model, driver_only_module.reward)
    message = str(raised.value)
    assert "EnvRunner 1 could not start: it cannot import module 'driver_only_rewards'" in message
    assert "defined there: env_config['reward_fn'] (driver_only_rewards.reward)" in message
    assert 'runtime_env={"py_modules": [driver_only_rewards]}' in message and "working_dir" in message
