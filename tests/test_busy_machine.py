"""Issue 56, item 2: CPU runs that stay fast on a busy machine. OpenMP threads that spin while they wait took the
cores of a busy 2-core machine from the working ones (the demo's base model: step 250 of 1,500 in 8.5 minutes), so
every process of a run gets a passive wait policy, set before torch loads OpenMP, unless the user chose one, and
thread counts derived from Ray's CPUs no larger than the cores. Measured: `benchmarks/busy_machine.py`."""

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import tiny_config

from rllib_p3o.core.cpu_threads import fitting_threads, usable_cores

# Records OMP_WAIT_POLICY as it is when torch is first imported (when torch loads OpenMP, which reads it then).
AT_TORCH_IMPORT = textwrap.dedent(
    """
    import os, sys

    seen = {}

    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and "torch" not in seen:
                seen["torch"] = os.environ.get("OMP_WAIT_POLICY")
            return None

    sys.meta_path.insert(0, Watch())
    import rllib_p3o
    import torch

    print(seen["torch"], os.environ.get("OMP_WAIT_POLICY"))
    """
)


def _policy_at_torch_import(**env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "RAY_", "RLLIB_P3O_"))}
    done = subprocess.run(
        [sys.executable, "-c", AT_TORCH_IMPORT], env={**clean, **env}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_import_gives_openmp_a_passive_wait_policy_before_torch_loads_it_unless_the_user_set_one(processes):
    assert _policy_at_torch_import() == ["PASSIVE", "PASSIVE"]
    assert _policy_at_torch_import(OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE", "ACTIVE"]


def test_a_thread_count_fits_the_cores_this_process_may_use():
    cores = len(os.sched_getaffinity(0))
    assert usable_cores() == cores
    assert fitting_threads(cores + 3) == cores and fitting_threads(1) == 1 and fitting_threads(0) == 1


@pytest.mark.slow
def test_runners_and_learners_wait_passively_with_no_more_threads_than_cores(ray_session, tiny_model):
    """A remote learner given 4 Ray CPUs on a machine with fewer cores gets as many torch threads as there are cores;
    the user's own ``num_threads_per_learner`` is kept as it is."""

    def openmp(_):
        import os

        import torch

        return os.environ.get("OMP_WAIT_POLICY"), torch.get_num_threads()

    cores = usable_cores()
    for learner_cpus, threads, expected in ((4, None, min(4, cores)), (1, 3, 3)):
        config = tiny_config(tiny_model).learners(num_learners=1, num_cpus_per_learner=learner_cpus)
        config.training(num_threads_per_learner=threads)
        algo = config.build_algo()
        try:
            learners = [r.get() for r in algo.learner_group.foreach_learner(openmp)]
            runners = algo.env_runner_group.foreach_env_runner(openmp, local_env_runner=False)
        finally:
            algo.stop()
        assert learners == [("PASSIVE", expected)], (learner_cpus, threads, learners)
        assert runners == [("PASSIVE", config.env_runner_threads)], runners


@pytest.mark.slow
def test_a_runner_given_more_ray_cpus_than_cores_gets_as_many_engine_threads_as_cores(ray_session, tiny_model):
    """A runner's engine threads derived from its Ray CPUs (4, plus the local learner's idle driver CPU in sync mode)
    are capped at the cores; the user's own ``num_threads_per_env_runner`` is kept as it is."""
    cores = usable_cores()
    for threads, expected in ((None, min(5, cores)), (3, 3)):
        config = (
            tiny_config(tiny_model).env_runners(num_cpus_per_env_runner=4).training(num_threads_per_env_runner=threads)
        )
        assert config.env_runner_threads == (5 if threads is None else 3)
        algo = config.build_algo()
        try:
            runners = algo.env_runner_group.foreach_env_runner(
                lambda _: __import__("torch").get_num_threads(), local_env_runner=False
            )
        finally:
            algo.stop()
        assert runners == [expected], (threads, runners)
