"""OpenMP threads that fit a shared CPU: a passive wait policy in every process of a run, and thread counts no larger
than the cores the process may use, unless the user chose their own.

GNU OpenMP (torch's, and so vLLM's CPU engine's) keeps a thread that has finished its share of the work spinning for
a while before it sleeps, in case more comes. On a machine whose cores are all busy (another program, or more
threads than cores) the spinning threads hold the cores the working ones need, and every parallel region waits for
its slowest thread: beside processes that kept both cores of a 2-core machine busy, `make demo`'s base-model
pretraining ran 47 times as fast with ``OMP_WAIT_POLICY=PASSIVE`` as with OpenMP's default wait
(`benchmarks/busy_machine.py`, docs/results/busy-machine.md).

The OpenMP runtime reads ``OMP_WAIT_POLICY`` once, when it is loaded (with torch). `apply_openmp_defaults` is the
first thing ``import rllib_p3o`` does, before anything imports torch; Ray's workers started afterwards inherit the
variable, and each imports the package before torch too. A value the user set is kept (``OMP_WAIT_POLICY=ACTIVE``
brings back the spinning, for a machine that does nothing else).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

# The environment the package gives OpenMP where the user has not set it.
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
OPENMP_DEFAULTS = {WAIT_POLICY_ENV: "PASSIVE"}


def apply_openmp_defaults() -> Dict[str, str]:
    """Set `OPENMP_DEFAULTS` in this process's environment where the user has not; returns what it set. It takes
    effect in an OpenMP runtime loaded afterwards: in this process if torch is not imported yet, and in every Ray
    worker started afterwards."""
    applied = {}
    for key, value in OPENMP_DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    return applied


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or ``taskset``'s limit), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def fitting_threads(wanted: int) -> int:
    """``wanted`` threads, but no more than `usable_cores`: Ray's logical CPUs may outnumber the cores (``ray.init(
    num_cpus=4)`` on 2 cores), and more OpenMP threads than cores wait on each other in every parallel region."""
    return max(1, min(int(wanted), usable_cores()))


def learner_threads(config: Any) -> Optional[int]:
    """Torch threads of each learner of a `P3OConfig`: ``num_threads_per_learner``, else its Ray CPUs
    (``num_cpus_per_learner``, 1 for "auto"); a local learner gets ``num_cpus_for_main_process`` in async mode, where
    it runs beside the runners, and None (torch's default: every core) in sync mode, where it never does."""
    if config.num_threads_per_learner:
        return int(config.num_threads_per_learner)
    if config.num_learners > 0:
        return max(1, int(config.num_cpus_per_learner)) if config.num_cpus_per_learner != "auto" else 1
    if config.async_sampling and config.num_env_runners > 0:
        return max(1, int(config.num_cpus_for_main_process))
    return None


def env_runner_threads(config: Any) -> int:
    """Torch/OpenMP threads of each runner's engine of a `P3OConfig`: ``num_threads_per_env_runner``, else its Ray
    CPUs plus, in sync mode with a local learner, a share of the driver's CPUs (``num_cpus_for_main_process``), idle
    while the runners generate (the mirror of `learner_threads` taking every core)."""
    borrowed = (
        int(config.num_cpus_for_main_process) // config.num_env_runners
        if not config.async_sampling and config.num_learners == 0 and config.num_env_runners > 0
        else 0
    )
    return int(config.num_threads_per_env_runner or (max(1, int(config.num_cpus_per_env_runner)) + borrowed))
