"""Thread budgets of learners and runners (`P3OConfig.learner_threads`, `env_runner_threads`): derived from the Ray
CPUs each one gets, so that in async mode generation and training run side by side (oversubscribed OpenMP threads
spin-wait on each other: on 2 cores, a 2-thread learner beside a 1-thread engine ran async steps at 0.55-0.61 s
instead of 0.32 s, `benchmarks/peer_trl.py`). Config only: the real actors' counts are checked in
test_async_behavior.py."""

import pytest

from rllib_p3o import P3OConfig


def _config(**training):
    return P3OConfig().training(model="unused", **training).env_runners(num_env_runners=1)


def test_a_local_learner_takes_every_core_in_sync_mode_and_its_own_cpus_in_async_mode():
    assert _config().learners(num_learners=0).learner_threads is None  # never runs beside the runners
    assert _config(async_sampling=True).learners(num_learners=0).learner_threads == 1
    cfg = _config(async_sampling=True).learners(num_learners=0).resources(num_cpus_for_main_process=3)
    assert cfg.learner_threads == 3


def test_remote_learners_take_their_ray_cpus():
    assert _config().learners(num_learners=2).learner_threads == 1  # "auto"
    assert _config().learners(num_learners=2, num_cpus_per_learner=2).learner_threads == 2


def test_runners_take_their_ray_cpus_and_explicit_settings_win():
    assert _config(async_sampling=True).env_runner_threads == 1
    assert _config(async_sampling=True).env_runners(num_cpus_per_env_runner=2).env_runner_threads == 2
    assert _config().learners(num_learners=2).env_runner_threads == 1  # remote learners keep their own CPUs
    cfg = _config(async_sampling=True, num_threads_per_learner=4, num_threads_per_env_runner=3)
    assert (cfg.learner_threads, cfg.env_runner_threads) == (4, 3)


def test_a_thread_count_below_one_is_refused():
    with pytest.raises(ValueError, match="num_threads_per_learner must be >= 1"):
        _config(num_threads_per_learner=0).validate()


def test_in_sync_mode_runners_borrow_the_local_learners_cpus_which_idle_while_they_generate():
    assert _config().learners(num_learners=0).env_runner_threads == 2  # its own CPU + the driver's
    cfg = _config().learners(num_learners=0).resources(num_cpus_for_main_process=4).env_runners(num_env_runners=2)
    assert cfg.env_runner_threads == 3  # the driver's 4 CPUs split between the 2 runners
    assert _config().env_runners(num_env_runners=2).env_runner_threads == 1  # 1 driver CPU does not split in two
    assert _config().env_runners(num_env_runners=0).env_runner_threads == 1  # the driver's own runner borrows nothing
