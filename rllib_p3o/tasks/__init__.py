"""Built-in tasks and the local tiny-model builder used by the demo, the examples and the tests."""

from rllib_p3o.tasks.arithmetic import ArithmeticTask, arithmetic_reward
from rllib_p3o.tasks.tiny_model import build_demo_model, build_tiny_model

__all__ = ["ArithmeticTask", "arithmetic_reward", "build_demo_model", "build_tiny_model"]
