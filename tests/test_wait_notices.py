"""Issue 56, item 4: no silent minutes. Before the status table's first row a run names what it waits for (the
trial's start, then the first iteration) once a wait has lasted 10 s, and the demo's base model, built by a script,
prints its pretraining's progress. The clock is faked where the waiting itself is what is tested; the pretraining is
real (the demo's base model, shortened)."""

import json
import os

from rllib_p3o.driver import wait_notices
from rllib_p3o.driver.progress import IterationPrinter
from rllib_p3o.driver.wait_notices import WaitNotices
from rllib_p3o.tasks import build_demo_model
from rllib_p3o.tasks.model_cache import STAMP_FILE
from rllib_p3o.tasks.pretrain import PretrainingProgress


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_wait_is_named_after_10_s_then_every_30_s_and_never_after_it_ends():
    clock = FakeClock()
    waits = WaitNotices(clock=clock)
    assert waits.due() is None  # nothing to wait for yet
    waits.begin("starting")
    clock.now += 9.9
    assert waits.due() is None
    clock.now += 0.2
    assert waits.due() == "  ... starting (0:10)"
    clock.now += 29
    assert waits.due() is None
    clock.now += 1.5
    assert waits.due() == "  ... starting (0:40)"
    waits.end()
    clock.now += 100
    assert waits.due() is None


def test_the_status_table_names_the_start_then_the_first_iteration_and_stops_at_the_first_row(capsys):
    """Tune's hooks in the order Tune calls them; the printer's clock is faked."""
    clock = FakeClock()
    printer = IterationPrinter()
    printer._waits = WaitNotices(clock=clock)
    printer.setup()
    for _ in range(3):  # Tune's loop steps about every 0.1 s; one notice per 10 s, not per step
        clock.now += 5.5
        printer.on_step_begin(iteration=0, trials=[])
    printer.on_trial_start(iteration=0, trials=[], trial=None)
    clock.now += 12
    printer.on_step_begin(iteration=0, trials=[])
    printer.on_trial_result(0, [], None, {"training_iteration": 1})
    clock.now += 60
    printer.on_step_begin(iteration=0, trials=[])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"  ... {wait_notices.STARTING} (0:11)"
    assert lines[1] == f"  ... {wait_notices.FIRST_ITERATION} (0:12)"
    assert lines[2].split()[0] == "iter" and lines[3].split()[0] == "1" and len(lines) == 4


def test_pretraining_progress_prints_the_first_step_then_every_10_s_and_the_last():
    clock, lines = FakeClock(), []
    progress = PretrainingProgress("building: ", 1500, clock=clock, out=lines.append)
    for step in range(0, 1500, 50):
        progress(step, 2.0)
        clock.now += 3.0
    progress(1499, 1.5)
    assert lines[0] == "building: pretraining step 1/1500, loss 2.000 (0:00)"
    # With the time left at the pace so far (issue 63: the docs' "about a minute" took 2:45 on busy cores).
    assert lines[1] == "building: pretraining step 201/1500, loss 2.000 (0:12, about 1:17 left)"
    assert lines[-1] == "building: pretraining step 1500/1500, loss 1.500 (1:30)"
    assert len(lines) == 9


def test_the_demo_base_model_prints_its_pretraining_progress_when_a_script_builds_it(tmp_path, capsys):
    """Real: the demo's base model with 101 pretraining steps (the same lines as 1,500), then reused silently."""
    path = str(tmp_path / "base_model")
    build_demo_model(path, pretrain_steps=101)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"building the demo's base model in {path}: pretraining step 1/101, loss ")
    assert lines[-1].startswith(f"building the demo's base model in {path}: pretraining step 101/101, loss ")
    with open(os.path.join(path, STAMP_FILE)) as f:
        assert json.load(f)["pretrain_steps"] == 101
    build_demo_model(path, pretrain_steps=101)  # cached: nothing to wait for, nothing printed
    build_demo_model(str(tmp_path / "quiet"), pretrain_steps=51, progress=False)
    assert capsys.readouterr().out == ""
