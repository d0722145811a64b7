"""Built-in tasks and the local tiny-model builder used by the demo, the examples and the tests.

To try a task of your own on CPU, `build_tiny_model` writes a tiny causal LM with a tokenizer trained on your
``corpus`` (a few lines of the task's text: every word and symbol the prompts and answers use); with
``special_tokens=CHAT_TOKENS, chat_template=CHAT_TEMPLATE`` its tokenizer renders chat messages, as conversational
prompts and multi-turn environments (verifiers', OpenEnv's) need. `build_demo_model` is the demo's base model: the
tiny model pretrained on the arithmetic task.
"""

from rllib_p3o.tasks.arithmetic import ArithmeticTask, arithmetic_reward
from rllib_p3o.tasks.tiny_model import CHAT_TEMPLATE, CHAT_TOKENS, build_demo_model, build_tiny_model

__all__ = [
    "ArithmeticTask",
    "arithmetic_reward",
    "build_demo_model",
    "build_tiny_model",
    "CHAT_TOKENS",
    "CHAT_TEMPLATE",
]
