"""The ``rllib-p3o`` command's everyday jobs, run for real: ``validate`` on prompt datasets (with a reward function)
and trajectories, ``train`` on the demo's YAML file through Ray Tune (with TensorBoard and W&B offline output), and
``export`` of the checkpoint it wrote, in a fresh process without Ray or vLLM."""

import glob
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rllib_p3o.cli import main
from rllib_p3o.cli.train import REPAIRED, ConfigFileError, build_config, read_config_file
from rllib_p3o.cli.validate import detect_kind
from rllib_p3o.driver.export import CheckpointNotFound, module_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_YAML = os.path.join(ROOT, "examples", "demo.yaml")
CHAT = [{"role": "system", "content": "add"}, {"role": "user", "content": "(12+34)%10="}]

REWARDS_MODULE = """
def exact(completions, answer, **kwargs):
    return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

def too_few(completions, **kwargs):
    return [1.0]

def not_numbers(completions, **kwargs):
    return ["yes"] * len(completions)
"""


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_validate_a_prompt_dataset_with_its_reward_functions(tmp_path, tiny_chat_model, rewards_module, capsys):
    rows = [{"prompt": CHAT, "answer": "6"}, {"prompt": CHAT, "answer": "7"}]
    good = _jsonl(tmp_path / "train.jsonl", rows)
    assert detect_kind(good) == "prompts"
    args = ["validate", good, "--model", tiny_chat_model, "--reward-fn", f"{rewards_module}:exact"]
    assert main(args + ["--completions-column", "answer"]) == 0
    out = capsys.readouterr().out
    assert "2 prompt rows; columns: answer, prompt" in out and "0 text, 2 chat messages" in out
    assert "chat template ok; prompt tokens min" in out and "exact: min 1, mean 1, max 1" in out

    # Bad rows are listed with their row and column; bad reward values name the function.
    bad = _jsonl(tmp_path / "bad.jsonl", rows + [{"question": "x"}, {"prompt": [{"role": "robot", "content": "hi"}]}])
    assert main(["validate", bad, "--reward-fn", f"{rewards_module}:too_few"]) == 1
    out = capsys.readouterr().out
    assert "row 2 has no 'prompt' column (columns: ['question'])" in out
    assert "row 3 column 'prompt': message 0 must be" in out
    assert "reward function too_few returned 1 rewards for 2 completions" in out
    assert main(["validate", good, "--reward-fn", f"{rewards_module}:not_numbers"]) == 1
    assert "not_numbers must return a list of floats" in capsys.readouterr().out


def test_validate_tells_prompt_parquet_from_trajectories(tmp_path, tiny_model, capsys):
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": "2"}]), prompts)
    traj = tmp_path / "traj.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "completion": "2", "reward": 1.0, "group_id": 0}]), traj)
    assert detect_kind(str(prompts)) == "prompts" and detect_kind(str(traj)) == "trajectories"
    assert main(["validate", str(prompts), "--model", tiny_model]) == 0
    assert "1 prompt rows" in capsys.readouterr().out
    assert main(["validate", str(traj)]) == 1  # a trajectory row needs behavior_logprobs
    assert "behavior_logprobs" in capsys.readouterr().out


# -- train's config file: --set, --resume, the first line (issue 63) -------------------------------------------------


def test_set_values_are_read_as_their_declared_types_and_a_wrong_type_names_the_setting(tiny_model):
    """The README's ``--set training.lr=1e-4``: YAML reads 1e-4 as a string, RLlib refused it as a schedule."""
    overrides = [f"training.model={tiny_model}", "training.lr=1e-4", "training.group_size=4"]
    config = build_config(read_config_file(DEMO_YAML, overrides), DEMO_YAML, overrides)
    assert (config.lr, config.group_size) == (1e-4, 4) and isinstance(config.lr, float)
    for item, message in (
        ("training.lr=fast", "training.lr is 'fast', a string; training.lr takes a number, a list or null"),
        ("training.group_size=1.5", "training.group_size is 1.5, a number; training.group_size takes an integer"),
        ("env_runners.num_env_runners=two", "num_env_runners is 'two', a string; env_runners.num_env_runners takes"),
    ):
        with pytest.raises(ConfigFileError) as e:
            build_config(read_config_file(DEMO_YAML, [item]), DEMO_YAML, [item])
        assert str(e.value).startswith(f"--set {item}: ") and message in str(e.value), str(e.value)


def test_the_resume_command_carries_the_runs_overrides_and_resume_reads_them_back(tmp_path):
    """After Ctrl-C the command printed ``rllib-p3o train demo.yaml --resume``, which dropped the run's ``--set``
    items (its model among them): run as printed, it failed."""
    import argparse
    import shlex

    from rllib_p3o.cli import train

    overrides = [f"run.storage_path={tmp_path}", "training.model=/models/my model", "training.lr=1e-4"]
    command = train.resume_command(DEMO_YAML, overrides)
    assert command.startswith(f"rllib-p3o train {DEMO_YAML} --set run.storage_path=") and command.endswith(" --resume")
    parser = argparse.ArgumentParser()
    train.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(shlex.split(command)[1:])  # the shell's reading of the printed line
    assert (args.config, args.set, args.resume) == (DEMO_YAML, overrides, True)

    # The run keeps its overrides with its experiment: --resume alone (the storage to find it) applies them, and a
    # key given again takes the command's value.
    spec, _ = train.run_spec(DEMO_YAML, overrides, resume=False)
    train.record_overrides(train.experiment_dir(spec, DEMO_YAML), overrides)
    spec, merged = train.run_spec(DEMO_YAML, [f"run.storage_path={tmp_path}", "training.lr=2e-4"], resume=True)
    assert spec["training"]["model"] == "/models/my model" and spec["training"]["lr"] == "2e-4"
    assert merged == ["training.model=/models/my model", f"run.storage_path={tmp_path}", "training.lr=2e-4"]


class _RayStarted(Exception):
    pass


def _start_ray(*args, **kwargs):
    raise _RayStarted()


def _experiment_tune_left_damaged(tmp_path, monkeypatch):
    """A stand-in of Tune's files (the piece these tests are not about): an experiment of the demo file whose state
    file is cut short, a trial with two checkpoints, and an empty Ray temp dir; Ray's start faked to raise
    `_RayStarted`, so that the command's checks before it are what runs."""
    import ray

    from rllib_p3o.driver.progress import QUIET_ENV

    for key in QUIET_ENV:  # the command sets them for its Ray workers: undone after the test
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray_tmp"))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _start_ray)
    experiment = tmp_path / "demo"
    trial = experiment / "P3O_TextEnv_0"
    for n in (4, 5):
        (trial / f"checkpoint_00000{n}").mkdir(parents=True)
    (experiment / "tuner.pkl").write_bytes(b"")  # what Tuner.can_restore looks for
    state = experiment / "experiment_state-2026-12-01_03-20-00.json"
    state.write_text('{"trial_data": [["{\\"trainable_name\\": "')  # cut short
    return experiment, trial, state


def test_resume_of_an_experiment_whose_state_tune_left_cut_short_says_so_before_ray_starts(
    tiny_model, tmp_path, capsys, monkeypatch
):
    """A driver killed while Tune copied its experiment state leaves the file cut short; Tune's restore then logged
    the decoding error and started the experiment over (its trials from iteration 1). Without Tune's staged copy to
    put back, the command stops first (status 2) and names the file and each trial's newest checkpoint."""
    experiment, trial, state = _experiment_tune_left_damaged(tmp_path, monkeypatch)
    overrides = ["--set", f"training.model={tiny_model}", "--set", f"run.storage_path={tmp_path}"]
    assert main(["train", DEMO_YAML, *overrides, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"error: Tune's experiment state {state} is cut short or damaged" in err, err
    assert f"newest checkpoint on disk: {trial / 'checkpoint_000005'}. P3O.from_checkpoint(path)" in err, err


def test_resume_puts_back_tunes_intact_staged_copy_of_a_damaged_experiment_state(
    tiny_model, tmp_path, capsys, monkeypatch
):
    """Tune writes the state into the Ray session's staging directory first: a driver killed during the copy leaves
    that one whole, and --resume puts it back (the damaged file kept) before Ray starts."""
    experiment, _, state = _experiment_tune_left_damaged(tmp_path, monkeypatch)
    staging = tmp_path / "ray_tmp" / "ray" / "session_2026-12-01_03-19-58_1_2" / "artifacts" / "2026-12-01_03-20-00"
    staged = staging / "demo" / "driver_artifacts" / state.name
    staged.parent.mkdir(parents=True)
    staged.write_text(json.dumps({"trial_data": [], "runner_data": {}}))
    overrides = ["--set", f"training.model={tiny_model}", "--set", f"run.storage_path={tmp_path}"]
    with pytest.raises(_RayStarted):
        main(["train", DEMO_YAML, *overrides, "--resume"])
    out = capsys.readouterr().out
    assert f"{REPAIRED}: put back Tune's intact copy {staged}" in out, out
    assert state.read_text() == staged.read_text()
    assert (experiment / (state.name + ".damaged")).read_text().startswith('{"trial_data": [["')


def test_a_config_that_needs_the_demos_base_model_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/demo/base_model here
    with pytest.raises(ConfigFileError, match=r"model='runs/demo/base_model': no such directory .* `make demo` builds"):
        build_config(read_config_file(DEMO_YAML), DEMO_YAML)


def test_train_says_what_it_does_before_the_config_checks_and_ray(capsys, monkeypatch):
    """The command was silent for 48 s (the checks, Ray's start) before its first line. A wrong --set value ends it
    before Ray starts (exit status 2): the line is already there."""
    from rllib_p3o.driver.progress import QUIET_ENV

    for key in QUIET_ENV:  # the command sets them for its Ray workers: undone after the test
        monkeypatch.delenv(key, raising=False)
    assert main(["train", DEMO_YAML, "--set", "training.lr=fast"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith(f"rllib-p3o train {DEMO_YAML}: checking the config, then starting Ray\n")
    assert "--set training.lr=fast: training.lr is 'fast'" in captured.err


def test_train_runs_the_demo_yaml_and_export_writes_a_model_transformers_loads(
    ray_session, tiny_model, tmp_path, capsys
):
    """The demo's file, two iterations on the tiny model: it misses its held-out target (exit 1, said so), leaves a
    checkpoint, TensorBoard events, W&B offline files and sample completions; export turns the checkpoint into a
    Hugging Face directory in a fresh process."""
    storage = str(tmp_path / "runs")
    status = main(
        [
            "train",
            DEMO_YAML,
            "--set",
            f"training.model={tiny_model}",
            "--set",
            f"run.storage_path={storage}",
            "--set",
            "run.stop.training_iteration=2",
            "--set",
            "run.progress_every=1",
            "--set",
            "run.tracking.wandb={project: p3o-test, mode: offline}",
        ]
    )
    captured = capsys.readouterr()
    assert status == 1, captured
    assert "Target NOT reached: p3o/heldout_reward_mean best" in captured.err
    rows = [line.split() for line in captured.out.splitlines()]
    assert any(row[:1] == ["iter"] for row in rows), captured.out  # the status table's header
    assert [row[0] for row in rows if row and row[0].isdigit()] == ["1", "2"], captured.out  # a row per iteration
    (trial,) = glob.glob(os.path.join(storage, "demo", "P3O_*"))
    from rllib_p3o.cli.train import recorded_overrides

    assert recorded_overrides(os.path.join(storage, "demo"))[:2] == [
        f"training.model={tiny_model}",
        f"run.storage_path={storage}",
    ]
    assert glob.glob(os.path.join(trial, "events.out.tfevents.*")), os.listdir(trial)  # TensorBoard (tensorboardX)
    assert glob.glob(os.path.join(trial, "wandb", "offline-run-*")), os.listdir(trial)  # W&B, offline
    assert len(pq.read_table(os.path.join(trial, "completions", "iter_000002.parquet"))) == 8
    assert "checkpoint_" in module_dir(trial)  # the trial's latest checkpoint (checkpoint_at_end)

    # Export in a fresh process where starting Ray or importing vLLM would fail (its time is
    # benchmarks/export.py's).
    out = str(tmp_path / "exported")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    no_ray_no_vllm = (
        "import sys, ray; sys.modules['vllm'] = None; "
        "ray.init = lambda *a, **k: sys.exit('export started Ray'); "
        "from rllib_p3o.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", no_ray_no_vllm, "export", trial, out], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} in "), done.stdout

    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    trained = dict(exported.named_parameters())
    assert any(not torch.equal(p, trained[n]) for n, p in base.named_parameters())  # two updates moved weights

    with pytest.raises(CheckpointNotFound, match="holds no policy checkpoint"):
        module_dir(str(tmp_path))
