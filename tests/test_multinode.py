"""More than one machine: a 2-node Ray cluster (`ray.cluster_utils.Cluster`, as RLlib's own tests build one) with the
runner on one node and the learner on another, forced by a custom resource per node. Real Ray, RLlib, vLLM.

The cluster lives for this test alone: while it does, a plain ``ray.init()`` on this machine would join it. The
session's Ray (`tests/conftest.py`) is shut down first and started again afterwards.
"""

import sys

import pytest
import ray

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.tasks import ArithmeticTask

# Ray actors unpickle this module's functions by value (the tests directory is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def two_nodes():
    from conftest import RAY_SESSION  # tests/ is on sys.path (pytest's rootdir-relative imports)
    from ray._common.utils import reset_ray_address
    from ray.cluster_utils import Cluster

    had_session = ray.is_initialized()
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})  # the driver's node
    # Cluster writes its address to /tmp/ray/ray_current_cluster, where any plain `ray.init()` on this machine would
    # join it: a script another test worker starts meanwhile (test scripts clear RAY_ADDRESS, as a user's shell).
    # This fixture joins by its address; nothing else may find it.
    reset_ray_address()
    try:
        cluster.add_node(num_cpus=2, resources={"runner_node": 1})
        cluster.add_node(num_cpus=2, resources={"learner_node": 1})
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=RAY_SESSION["runtime_env"])
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_session:
            ray.init(**RAY_SESSION)


def _node_id(_=None) -> str:
    return ray.get_runtime_context().get_node_id()


def _learner_node(algo) -> str:
    return next(iter(algo.learner_group.foreach_learner(lambda learner: _node_id()))).get()


@pytest.mark.slow
def test_runner_and_learner_on_two_nodes_train_checkpoint_and_restore(two_nodes, tiny_model, tmp_path):
    def starts_with_digit(prompts, completions, **_):
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    task = ArithmeticTask()
    config = (
        P3OConfig()
        .environment(env_config={"dataset": task.train_rows()[:200], "reward_fn": starts_with_digit})
        .training(model=tiny_model, group_size=4, prompts_per_step=8, max_tokens=2, lr=1e-2, eval_interval=0)
        # The shared storage a multi-node run needs: the recording and the checkpoint on a path every node sees.
        .training(record_rollouts=str(tmp_path / "traj"))
        .env_runners(num_env_runners=1, custom_resources_per_env_runner={"runner_node": 1})
        .learners(num_learners=1, num_cpus_per_learner=1, custom_resources_per_learner={"learner_node": 1})
        .debugging(seed=0)
    )
    runner_node, learner_node = (
        next(n["NodeID"] for n in ray.nodes() if resource in n["Resources"])
        for resource in ("runner_node", "learner_node")
    )
    algo = config.build_algo()
    try:
        assert algo._runners.call_first(_node_id) == runner_node
        assert _learner_node(algo) == learner_node != _node_id()
        results = [algo.train() for _ in range(2)]
        for res in results:
            assert res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3  # weights crossed nodes and were verified
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        assert algo.export_hf(str(tmp_path / "hf")) == str(tmp_path / "hf")  # written by the learner's node
        assert (tmp_path / "hf" / "config.json").exists()
    finally:
        algo.stop()

    restored = P3O.from_checkpoint(checkpoint)
    try:
        assert restored._runners.call_first(_node_id) == runner_node and _learner_node(restored) == learner_node
        res = restored.train()
        assert res["training_iteration"] == 3 and res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
    finally:
        restored.stop()
    assert sorted(p.name for p in (tmp_path / "traj").iterdir()) == [f"part-{i:07d}.parquet" for i in range(3)]
