"""Plain helpers the tests import (``from helpers import tiny_config``); the fixtures are in `conftest.py`."""

import os
import shutil
from pathlib import Path

from rllib_p3o.tasks.model_cache import STAMP_FILE
from rllib_p3o.tasks.scenarios import tiny_run

# The tests' tiny online run (the one scenario factory it is: `rllib_p3o.tasks.scenarios.tiny_run`).
tiny_config = tiny_run

# The base model ``make demo`` builds, which the getting-started script reuses when it was built the same way.
MAKE_DEMO_BASE_MODEL = Path(__file__).resolve().parents[1] / "runs" / "demo" / "base_model"
_BUILT = STAMP_FILE  # written last by ``build_demo_model``


def copy_demo_base_model(kept: Path, workdir: Path) -> None:
    """Copy a built demo base model into ``workdir/base_model``, where the getting-started script looks: the one the
    session kept (``kept``, the `demo_base_model` fixture), else the one ``make demo`` built, else none (the script
    builds it)."""
    for built in (kept, MAKE_DEMO_BASE_MODEL):
        if os.path.exists(os.path.join(built, _BUILT)):
            shutil.copytree(built, workdir / "base_model")
            return


def keep_demo_base_model(workdir: Path, kept: Path) -> None:
    """Keep the base model a script built in ``workdir`` for the session's next test (`copy_demo_base_model`)."""
    if not os.path.exists(os.path.join(kept, _BUILT)) and os.path.exists(workdir / "base_model" / _BUILT):
        shutil.copytree(workdir / "base_model", kept, dirs_exist_ok=True)


def rest_of_output(proc, timeout: float) -> str:
    """What ``proc`` (text ``stdout`` pipe, already read line by line) prints until it ends, waiting at most
    ``timeout`` s for the end (`subprocess.TimeoutExpired` after it). Read through the same file object as the lines
    before it: ``communicate()`` reads the pipe itself and loses what that object has buffered already (under load,
    the lines printed right after the last one read)."""
    import subprocess
    import threading

    rest: list = []
    drain = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
    drain.start()
    proc.wait(timeout=timeout)
    drain.join(timeout=30)
    if drain.is_alive():
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return "".join(rest)
