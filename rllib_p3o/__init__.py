"""rllib-p3o: batch-adaptive P3O post-training of language models as a Ray RLlib algorithm.

``import rllib_p3o`` registers the algorithm with Tune under the name ``"P3O"`` (an interrupted Tune run then says so,
with the call that resumes it: `rllib_p3o.driver.interruption`), gives OpenMP a passive wait policy
in every process of a run unless the user set one (`rllib_p3o.core.cpu_threads`: spinning threads make a busy CPU
crawl), and keeps the libraries' chatter off the screen in every process of a run (`rllib_p3o.core.quiet`;
``RLLIB_P3O_VERBOSE=1`` shows it).

Without Ray installed the package still imports: the losses and batch statistics (`rllib_p3o.core`) and the learner's compute core
(`rllib_p3o.learner.compute`) need only torch and transformers. ``P3O`` and ``P3OConfig`` then raise the
ImportError that importing Ray raised.
"""

from typing import Any, Optional

from rllib_p3o.core.cpu_threads import apply_openmp_defaults
from rllib_p3o.core.quiet import quiet_libraries

apply_openmp_defaults()  # before anything below imports torch: OpenMP reads it once, when torch loads it
quiet_libraries()  # before the imports below load Ray, RLlib, transformers (and, in a runner, vLLM)

from rllib_p3o.core.batch_stats import effective_sample_size, group_advantages  # noqa: E402
from rllib_p3o.core.losses.grpo import grpo_loss  # noqa: E402
from rllib_p3o.core.losses.kl_estimators import kl_k3  # noqa: E402
from rllib_p3o.core.losses.p3o import p3o_loss  # noqa: E402

try:
    from rllib_p3o.p3o import P3O, P3OConfig  # noqa: E402
except ImportError as e:  # Ray (or RLlib) missing: the Ray-free parts stay usable
    if (e.name or "").partition(".")[0] != "ray":
        raise
    _RAY_IMPORT_ERROR: Optional[ImportError] = e
else:
    _RAY_IMPORT_ERROR = None

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

quiet_libraries()  # again: importing RLlib above set its logger's level to WARNING


def __getattr__(name: str) -> Any:
    """``P3O`` and ``P3OConfig`` when Ray could not be imported (PEP 562): that ImportError, raised where used."""
    if name in ("P3O", "P3OConfig") and _RAY_IMPORT_ERROR is not None:
        raise ImportError(f"rllib_p3o.{name} needs Ray: {_RAY_IMPORT_ERROR}") from _RAY_IMPORT_ERROR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_with_tune() -> None:
    from ray.tune.registry import register_trainable

    from rllib_p3o.core.quiet import verbose
    from rllib_p3o.driver.interruption import show_tune_interruptions
    from rllib_p3o.driver.one_line_errors import show_config_errors_as_one_line

    register_trainable("P3O", P3O)
    show_tune_interruptions(quiet=not verbose())  # Ctrl-C: the notice and the exact restore call, on the screen
    show_config_errors_as_one_line()  # a mistake in the config ends a script as its message, not Tune's traceback


if _RAY_IMPORT_ERROR is None:
    _register_with_tune()
