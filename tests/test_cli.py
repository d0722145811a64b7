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
