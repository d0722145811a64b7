"""The demo's design (its base model's corpus) and its promise to a user: a clean screen, and a missed target is
never reported as a success. The end-to-end test runs the real demo script (Ray, Tune, vLLM) with a short
pretraining and 2 iterations, so it cannot reach the target."""

import json
import os
import subprocess
import sys

import pytest

from rllib_p3o.tasks import ArithmeticTask

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pretraining_corpus_shows_the_format_on_30_percent_of_training_pairs_40_percent_right_no_heldout_pair():
    task = ArithmeticTask()
    corpus = task.pretraining_corpus()
    formatted = [line for line in corpus if line.startswith("(")]
    sums = [line for line in corpus if not line.startswith("(")]
    train = {r["prompt"]: r["answer"] for r in task.train_rows()}
    assert len(formatted) == round(0.3 * len(train))
    right = [line for line in formatted if train[line[:-1]] == line[-1]]  # training pairs only (KeyError otherwise)
    assert len(right) == round(0.4 * len(formatted))
    for line in set(formatted) - set(right):  # every other answer carries a spurious 1
        a, b = int(line[1:3]), int(line[4:6])
        assert line[-1] == str((a + b + 1) % 10)
    heldout_pairs = {r["prompt"][1:6] for r in task.heldout_rows()}
    assert len(sums) == len(train) and not any(line[:5] in heldout_pairs for line in sums)
    assert set(task.pretraining_corpus(seed=1)) != set(corpus)  # the seed picks other format lines
    assert task.pretraining_corpus(format_fraction=0.0) == sums


@pytest.mark.slow
def test_demo_that_misses_its_target_says_so_on_a_quiet_screen_and_exits_1(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_"))}
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "demo.py"),
            "--out",
            str(tmp_path),
            "--iterations",
            "2",
            "--pretrain-steps",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=str(tmp_path),
    )
    screen = proc.stdout + proc.stderr
    assert proc.returncode == 1, screen
    assert "Target NOT reached" in screen
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["target_reached"] is False and summary["iterations"] == 2
    assert os.path.isdir(summary["final_model"]) and os.path.exists(summary["plot"])  # nothing trained is lost
    noise = [
        line
        for line in screen.splitlines()
        if "WARNING" in line
        or "Loading weights" in line
        or "tensorboard" in line.lower()
        or "Configuration for experiment" in line
    ]
    assert not noise, "\n".join(noise)
