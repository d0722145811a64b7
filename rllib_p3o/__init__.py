"""rllib-p3o: batch-adaptive P3O post-training of language models as a Ray RLlib algorithm.

``import rllib_p3o`` registers the algorithm with Tune under the name ``"P3O"``, and keeps the libraries' chatter
off the screen in every process of a run (`rllib_p3o.core.quiet`; ``RLLIB_P3O_VERBOSE=1`` shows it).
"""

from rllib_p3o.core.quiet import quiet_libraries

quiet_libraries()  # first: before the imports below load Ray, RLlib, transformers (and, in a runner, vLLM)

from rllib_p3o import _moved  # noqa: E402
from rllib_p3o.core.objectives import effective_sample_size, group_advantages, grpo_loss, kl_k3, p3o_loss  # noqa: E402
from rllib_p3o.p3o import P3O, P3OConfig  # noqa: E402

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
quiet_libraries()  # again: importing RLlib above set its logger's level to WARNING


def _register_with_tune() -> None:
    from ray.tune.registry import register_trainable

    register_trainable("P3O", P3O)


_register_with_tune()
