"""rllib-p3o: batch-adaptive P3O post-training of language models as a Ray RLlib algorithm.

``import rllib_p3o`` registers the algorithm with Tune under the name ``"P3O"``.
"""

from rllib_p3o import _moved
from rllib_p3o.core.objectives import effective_sample_size, group_advantages, grpo_loss, kl_k3, p3o_loss
from rllib_p3o.p3o import P3O, P3OConfig

__all__ = [
    "P3O",
    "P3OConfig",
    "effective_sample_size",
    "group_advantages",
    "grpo_loss",
    "kl_k3",
    "p3o_loss",
]
__version__ = "0.2.0.dev0"


_moved.install()


def _register_with_tune() -> None:
    from ray.tune.registry import register_trainable

    register_trainable("P3O", P3O)


_register_with_tune()
