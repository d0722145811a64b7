"""Every command and code block the README and the docs give a user is run as written by a test, or is marked here
with the reason none can run it (a GPU, a cluster, a real model or dataset of the user's, hours of compute): a page
cannot promise a command that fails, and a new block fails `test_every_block_and_command_is_accounted_for` until it
is one or the other.

- Python *fragments* (a few calls on a ``config`` the page has built before) run here as written, on a real
  `P3OConfig`; the names a fragment takes from its page (``algo``, ``tune``, ``rows``, a reward function) are given
  to it, and calls on the objects a fragment cannot build here (a trained ``algo``, Tune, Ray) are checked against the
  real method's signature (`Checked`), not made.
- Python *scripts* (a page's complete program) and shell commands are run as written by the test `RUN_BY` names.
"""

import glob
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "CONTRIBUTING.md"] + sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    if os.sep + "results" + os.sep not in p  # a results page's commands: tests/test_results_commands.py
)
_FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
SHELL = ("bash", "sh", "shell", "console")


def blocks():
    """``(page, kind, first line, text)`` of every fenced block: ``"python"`` blocks whole, shell blocks line by line
    (a line continued with ``\\`` joined to the next; comments left out)."""
    out = []
    for page in PAGES:
        for lang, body in _FENCE.findall(open(os.path.join(ROOT, page)).read()):
            if lang == "python":
                out.append((page, "python", body.strip().splitlines()[0].strip(), body))
            elif lang in SHELL:
                for line in body.replace("\\\n", " ").splitlines():
                    command = " ".join(re.split(r"\s#(?:\s|$)", line)[0].split())
                    if command and not command.startswith("#"):
                        out.append((page, "shell", command, command))
    return out


# Complete programs and shell commands, by (page, first line): the test that runs it as written.
RUN_BY = {
    ("CONTRIBUTING.md", '"""Truncated-IS policy gradient (an example): -sg(min(r, max_weight))·logπθ·A, token-mean over the global batch."""'): "tests/test_losses.py::test_the_contributing_example_registers_validates_and_passes_its_own_test",
    ("CONTRIBUTING.md", "import pytest"): "tests/test_losses.py::test_the_contributing_example_registers_validates_and_passes_its_own_test",
    ("CONTRIBUTING.md", '"""Guess a digit (an example adapter): prompt rows with a secret digit, and a multi-turn environment that says'): "tests/test_recipes.py::test_the_environment_recipe_runs_as_written",
    ("CONTRIBUTING.md", "from rllib_p3o.envs.guess_digit import GuessDigitEnv, guess_digit_rows"): "tests/test_recipes.py::test_the_environment_recipe_runs_as_written",
    ("CONTRIBUTING.md", "config.environment("): "tests/test_recipes.py::test_the_environment_recipe_runs_as_written",
    ("docs/getting-started.md", "import json"): "tests/test_getting_started.py::test_the_first_training_run_runs_as_written",
    ("docs/guide/async-and-behavior-models.md", "import os"): "tests/test_screen.py::test_the_async_guides_inflight_example_is_a_script_whose_screen_shows_spanning_completions_and_no_drop",
    ("docs/guide/environments.md", "# my_sum.py: a verifiers taskset (verifiers.v1) with one reward"): "tests/test_verifiers_recipe.py::test_the_verifiers_recipe_trains_on_its_own_task_as_written",
    ("docs/guide/environments.md", "# train_my_sum.py: a tiny chat model trained on my_sum's tasks"): "tests/test_verifiers_recipe.py::test_the_verifiers_recipe_trains_on_its_own_task_as_written",
    ("README.md", ".venv/bin/rllib-p3o train examples/demo.yaml --set training.lr=1e-4"): "tests/test_docs_commands.py::test_the_demo_config_runs_as_the_docs_write_it_and_the_command_it_prints_runs_it_again",
    ("docs/guide/command-line.md", "rllib-p3o train examples/demo.yaml"): "tests/test_docs_commands.py::test_the_demo_config_runs_as_the_docs_write_it_and_the_command_it_prints_runs_it_again",
    ("docs/guide/command-line.md", "rllib-p3o export runs/cli/demo OUT_DIR"): "tests/test_docs_commands.py::test_the_demo_config_runs_as_the_docs_write_it_and_the_command_it_prints_runs_it_again",
    ("README.md", "make test"): "CI: .ci/run is `make test`",
    ("docs/getting-started.md", "make test"): "CI: .ci/run is `make test`",
}  # fmt: skip
# What no test runs as written, with the reason.
_USER_FILES = "placeholders for the user's own files and model (validate runs on real files in tests/test_cli.py)"
_GPU_FORM = "the GPU form (2 GPUs and the user's model); its CPU form is getting started's first run, run as written"
_MINUTES = (
    "minutes to hours of training on 2 cores; its run is the results page it feeds; "
    "test_every_sweep_command_parses_and_builds_its_grid gives it to the sweep's own entry point up to the training"
)
NOT_RUN = {
    ("README.md", "# GPU form: your model and data, 2 GPUs (on CPU: getting started's first training run)."): _GPU_FORM,
    ("docs/getting-started.md", "# GPU only: not run by the documentation's test."): _GPU_FORM,
    ("README.md", "make demo"): "the demo's whole run (minutes of pretraining and training): docs/results/demo.md is its "
    "measurement; tests/test_demo.py runs examples/demo.py, which make demo runs, for 2 iterations",
    ("docs/getting-started.md", "make demo"): "as README's make demo",
    ("docs/getting-started.md", 'pip install "torch==2.13.0" -c constraints-cpu.txt && pip install ".[cpu]" -c constraints-cpu.txt && pip uninstall -y torchvision torchaudio torchcodec'): "installs the package: make install runs the same steps in CI",
    ("docs/getting-started.md", 'pip install ".[gpu]"'): "installs the GPU stack (CUDA torch, upstream vllm): a GPU machine",
    ("docs/guide/command-line.md", "rllib-p3o validate train.jsonl --model /path/to/model --reward-fn my_rewards:accuracy"): _USER_FILES,
    ("docs/guide/offline-and-recording.md", "rllib-p3o validate runs/traj --model /path/to/hf-causal-lm"): _USER_FILES,
    ("docs/guide/command-line.md", "rllib-p3o sweep --task sorting --quick --out runs/bench-quick"): _MINUTES,
    ("README.md", ".venv/bin/rllib-p3o sweep --quick --out runs/quick"): _MINUTES,
    ("README.md", ".venv/bin/rllib-p3o sweep --full --out runs/sweep"): _MINUTES,
    ("README.md", ".venv/bin/rllib-p3o sweep --task sorting --full --parallel 2 --out runs/bench"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --full --out runs/sweep"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --quick --out runs/quick"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --full --parallel 2 --out runs/bench"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --development --round staleness --parallel 2 --out runs/bench-development"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --confirmation --round staleness --parallel 2 --out runs/bench-confirmation"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --inflight --parallel 2 --out runs/bench-inflight"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --development --parallel 2 --out runs/bench-provenance-development"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --confirmation --round first-choice --parallel 2 --out runs/bench-provenance-first-confirmation"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task sorting --confirmation --parallel 2 --out runs/bench-provenance-confirmation"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task addition --development --parallel 2 --out runs/bench-addition-development"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task addition --confirmation --parallel 2 --out runs/bench-addition-confirmation"): _MINUTES,
    ("docs/guide/sweep.md", ".venv/bin/rllib-p3o sweep --task addition --confirmation --regimes async_staleness_8 four_steps_per_batch --methods p3o_other_alone --lr 0.000125 --parallel 2 --out runs/bench-addition-confirmation-rate"): _MINUTES,
    ("docs/guide/environments.md", "python examples/environments.py reasoning-gym"): "minutes each on 2 cores; the same "
    "wiring is trained end to end by tests/test_reward_recipes.py, tests/test_openenv_env.py, tests/test_reward_models.py "
    "and tests/test_verifiers_env.py",
    ("docs/guide/environments.md", "python examples/environments.py openenv"): "as reasoning-gym's",
    ("docs/guide/environments.md", "python examples/environments.py reward-models"): "as reasoning-gym's",
    ("docs/guide/environments.md", "python examples/environments.py verifiers"): "as reasoning-gym's",
    ("docs/guide/environments.md", "python examples/environments.py verifiers-single"): "as reasoning-gym's",
    ("docs/guide/environments.md", "import ray"): "builds a tiny policy and a reward model and trains an iteration with "
    "both reward-model actors: the same wiring is tests/test_reward_models.py's training test",
    ("docs/guide/environments.md", "from rllib_p3o.envs.verifiers_tasks import verifiers_dataset"): "a placeholder for "
    "the user's own verifiers environment (my_env); the recipe below it is run as written",
    ("docs/guide/coming-from-trl.md", "# TRL"): "TRL's code, side by side with ours (TRL is no dependency)",
    ("docs/guide/coming-from-trl.md", "import pandas as pd"): "reads a table a run of the user's wrote",
    ("docs/guide/multi-node.md", "import ray"): "a Ray cluster of GPU nodes and object storage",
    ("docs/guide/experiment-tracking.md", "from ray.air.integrations.mlflow import MLflowLoggerCallback"): "needs mlflow, "
    "which the package does not install (the W&B and TensorBoard blocks run)",
}  # fmt: skip


def _key(block):
    return block[0], block[2]


def test_every_block_and_command_is_accounted_for():
    """A block is a fragment run here, run by the test `RUN_BY` names, or in `NOT_RUN` with why; nothing else, and
    no entry names a block the pages no longer have (a stale entry would hide a new one)."""
    found = {_key(b): b for b in blocks()}
    for key, block in found.items():
        if key in RUN_BY or key in NOT_RUN:
            continue
        assert block[1] == "python" and _is_fragment(block[3]), (
            f"{key[0]}: {key[1]!r} is neither a fragment this test runs nor in RUN_BY (the test that runs it as "
            "written) or NOT_RUN (why none can): add it to tests/test_docs_commands.py"
        )
    stale = [key for key in {**RUN_BY, **NOT_RUN} if key not in found]
    assert not stale, f"entries for blocks the pages no longer have: {stale}"
    for key, test in RUN_BY.items():  # each named test exists, and reads the page it runs
        if test.startswith("CI:"):
            continue
        path, name = test.split("::")
        source = open(os.path.join(ROOT, path)).read()
        assert f"def {name}(" in source, test
        assert os.path.basename(key[0]) in source or key[0] == "README.md" and "README" in source, (test, key[0])


def _is_fragment(text: str) -> bool:
    """A fragment works on objects its page built before (it does not build its own config or run a script)."""
    return "P3OConfig()" not in text or "config = (" in text


# -- fragments, run as written --------------------------------------------------------------------------------------


class Checked:
    """An object a fragment cannot build here (a trained algorithm, Tune, Ray): attribute access reaches the real
    object's attribute, and a call is checked against the real callable's signature (an unknown keyword, a missing
    argument fail as they would) and returns another `Checked` of nothing (anything may follow: ``.fit()``)."""

    def __init__(self, target: Any, bound_to_instance: bool = False):
        self._target, self._bound = target, bound_to_instance

    def __getattr__(self, name: str) -> "Checked":
        if self._target is None:
            return Checked(None)
        attr = inspect.getattr_static(self._target, name) if inspect.isclass(self._target) else None
        instance_method = inspect.isfunction(attr) and self._bound
        return Checked(getattr(self._target, name), bound_to_instance=instance_method)

    def __call__(self, *args: Any, **kwargs: Any) -> "Checked":
        if self._target is not None and callable(self._target):
            signature = inspect.signature(self._target)
            signature.bind(*((None,) if self._bound else ()), *args, **kwargs)
        return Checked(None)


def _prelude(tmp_path) -> dict:
    """What the fragments take from their pages: a config, a trained algorithm and Tune (checked calls), a dataset,
    rows, reward functions and a tool."""
    import datasets

    from rllib_p3o import P3O, P3OConfig

    def reward_fn(prompts, completions, answer, **kw):
        return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]

    def calc(expression: str) -> str:
        return str(expression)

    from ray import tune

    rows = [{"prompt": "2+2=", "answer": "4"}]
    return {
        "config": P3OConfig(),
        "algo": Checked(P3O, bound_to_instance=True),
        "P3O": Checked(P3O),
        "tune": Checked(tune),
        "path": str(tmp_path / "ckpt"),
        "rows": rows,
        "hf_dataset": datasets.Dataset.from_list(rows),
        "reward_fn": reward_fn,
        "accuracy": reward_fn,
        "fmt": reward_fn,
        "calc": calc,
        "guess_digit_rows": lambda n: rows * n,
    }


FRAGMENTS = [b for b in blocks() if b[1] == "python" and _key(b) not in RUN_BY and _key(b) not in NOT_RUN]


@pytest.mark.parametrize("block", FRAGMENTS, ids=[f"{b[0]}:{b[2][:40]}" for b in FRAGMENTS])
def test_every_python_fragment_runs_as_written(block, tmp_path, monkeypatch):
    """A fragment's calls run on a real config (settings are checked when they are set: an unknown keyword, a bad
    loss setting, a misspelled keyword fail here as in a user's script), its other calls are checked against the
    real signatures."""
    monkeypatch.chdir(tmp_path)
    exec(compile(block[3], f"{block[0]} ({block[2][:40]})", "exec"), _prelude(tmp_path))


# -- the demo config from the command line, as the README and the command-line guide write it ------------------------


def _run_until_rows(processes, command, cwd, rows: int, timeout: float = 600):
    """Run ``command`` (a shell line as the docs write it, ``.venv/bin/`` or not) in ``cwd`` until its status table
    has shown ``rows`` rows, then Ctrl-C it; returns its exit status and screen."""
    argv = shlex.split(command)
    argv[0] = os.path.join(os.path.dirname(sys.executable), os.path.basename(argv[0]))
    proc = processes.popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    screen, seen, deadline = [], 0, time.time() + timeout
    for line in proc.stdout:
        screen.append(line)
        if re.match(r"^\s+\d+\s+\d+:\d\d", line):  # a status row: "   3   0:12 ..."
            seen += 1
            if seen >= rows:
                proc.send_signal(signal.SIGINT)
        if time.time() > deadline:
            proc.kill()
            break
    return proc.wait(timeout=120), "".join(screen)


def test_the_demo_config_runs_as_the_docs_write_it_and_the_command_it_prints_runs_it_again(
    processes, demo_base_model, tmp_path
):
    """README's ``rllib-p3o train examples/demo.yaml --set training.lr=1e-4`` (the value a float, not YAML's string)
    in a folder where ``make demo`` has built the base model: it trains, Ctrl-C ends it with status 130 and the
    command to run it again, with the same override, which run as printed trains the demo to its target; the command
    line guide's plain ``rllib-p3o train examples/demo.yaml`` starts as well, and its ``rllib-p3o export runs/cli/demo
    OUT_DIR`` writes a model. (The demo reaches its target within about 5 iterations, so Ctrl-C comes at the first
    row, before the first checkpoint: the command printed is the one that runs it again.)"""
    from helpers import copy_demo_base_model

    from rllib_p3o.tasks import build_demo_model
    from rllib_p3o.tasks.model_cache import STAMP_FILE

    work = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "examples"), work / "examples")
    (work / "runs" / "demo").mkdir(parents=True)
    if not (demo_base_model / STAMP_FILE).exists():  # what `make demo` builds, once per test session
        build_demo_model(str(demo_base_model), progress=False)
    copy_demo_base_model(demo_base_model, work / "runs" / "demo")
    readme = next(c for p, k, c, _ in blocks() if p == "README.md" and "train examples/demo.yaml" in c)
    status, screen = _run_until_rows(processes, readme, work, rows=1)  # Ctrl-C at its first row
    assert status == 130, screen[-3000:]
    printed = re.search(r"(?:run it again|continue it with): (rllib-p3o train .*)", screen)
    assert printed and "training.lr=1e-4" in printed.group(1), screen[-3000:]
    # The printed command, run as printed, trains the demo to its target (it reaches 0.9 in a few iterations).
    argv = shlex.split(printed.group(1))
    done = processes.run([os.path.join(os.path.dirname(sys.executable), argv[0]), *argv[1:]], cwd=work, timeout=900)
    assert done.returncode == 0 and "Target reached" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    guide = next(c for p, k, c, _ in blocks() if p.endswith("command-line.md") and c.endswith("examples/demo.yaml"))
    status, plain = _run_until_rows(processes, guide, work, rows=1)
    assert status == 130, plain[-3000:]
    export = next(c for p, k, c, _ in blocks() if p.endswith("command-line.md") and c.startswith("rllib-p3o export"))
    done = processes.run(
        [os.path.join(os.path.dirname(sys.executable), "rllib-p3o"), *shlex.split(export)[1:]], cwd=work
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.exists(work / "OUT_DIR" / "config.json")


# -- the sweeps the docs give: their arguments and grids, as written ---------------------------------------------------


SWEEPS = [b for b in blocks() if b[1] == "shell" and re.match(r"^(\.venv/bin/)?rllib-p3o sweep ", b[3])]


@pytest.mark.parametrize("block", SWEEPS, ids=[f"{b[0]}:{b[3][:60]}" for b in SWEEPS])
def test_every_sweep_command_parses_and_builds_its_grid(block, tmp_path, monkeypatch):
    """Each ``rllib-p3o sweep`` line the docs give (hours of training each: `NOT_RUN`) goes through the sweep's own
    entry point as written: its flags parse and name a grid with trials. Only the run is faked (it records what it
    was given instead of starting Ray): the part this test is not about."""
    from rllib_p3o.sweep import run as sweep_run

    given = {}
    monkeypatch.setattr(sweep_run, "_run", lambda out, grid, args: given.update(out=out, grid=grid) or 0)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(block[3])
    assert sweep_run.main(argv[2:]) == 0
    out = argv[argv.index("--out") + 1]
    assert given["out"] == os.path.abspath(out) and given["grid"].num_trials() > 0
