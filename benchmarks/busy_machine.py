"""`make demo` on a busy machine: the demo beside a CPU-bound load, with OpenMP's default spinning wait and with the
passive wait policy that ``import rllib_p3o`` sets (`rllib_p3o.core.cpu_threads`).

    python benchmarks/busy_machine.py [--load 2] [--time-limit 600] [--out results/benchmarks/busy_machine.json]

Each arm runs ``python examples/demo.py`` (what ``make demo`` runs) in a fresh output folder, so that the base model
is built (pretrained for 1,500 steps) and trained, beside ``--load`` processes that each keep one core busy (a pure
Python loop: the other program of a shared machine). The arms differ only in the demo's environment:

- ``spin``: ``GOMP_SPINCOUNT=300000``, the spin count GNU OpenMP uses when ``OMP_WAIT_POLICY`` is not set (libgomp's
  manual): OpenMP's default wait, as every process had it before the package set a passive policy;
- ``passive``: the package's default (``OMP_WAIT_POLICY=PASSIVE``, no spin count).

Reported per arm: the pretraining's steps per second (from the demo's progress lines, timed as they are printed), when
the base model was ready, the whole demo's wall time and whether it reached its target, or, for an arm stopped at
``--time-limit`` seconds, the last pretraining step it reached. The machine's other work is not controlled: the JSON
records when each arm started and the load average before it. The file is written after each arm; ``--arms`` with
one arm replaces that arm's entry in an existing file of the same settings and keeps the other's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "demo.py")
# The environment that makes each arm: the only difference between them.
ARMS = {"spin": {"GOMP_SPINCOUNT": "300000"}, "passive": {}}
PRETRAIN_STEPS = 1500  # examples/demo.py's default, as `make demo` runs it
_STEP = re.compile(r"pretraining step\s+(\d+)")
_BUSY_LOOP = "while True: pass"


def _demo_env(arm: str) -> Dict[str, str]:
    """The environment of a user's shell (no OpenMP settings of this one), plus the arm's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_", "RAY_", "RLLIB_P3O_"))}
    return {**env, **ARMS[arm]}


def _read_lines(stream, lines: List[Tuple[float, str]], t0: float) -> None:
    for line in iter(stream.readline, ""):
        lines.append((time.monotonic() - t0, line.rstrip("\n")))


def run_arm(arm: str, load: int, time_limit: float) -> dict:
    """One demo beside ``load`` busy processes; its lines timed as they are printed."""
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP]) for _ in range(load)]
    load_before = os.getloadavg()[0]
    lines: List[Tuple[float, str]] = []
    try:
        with tempfile.TemporaryDirectory(prefix=f"busy_{arm}_") as out:
            t0 = time.monotonic()
            demo = subprocess.Popen(
                [sys.executable, DEMO, "--out", out],
                env=_demo_env(arm),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            reader = threading.Thread(target=_read_lines, args=(demo.stdout, lines, t0), daemon=True)
            reader.start()
            try:
                returncode = demo.wait(timeout=time_limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                demo.kill()
                returncode, timed_out = demo.wait(), True
            wall = time.monotonic() - t0
            reader.join(timeout=10)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return _summary(arm, lines, wall, returncode, timed_out, load_before)


def _summary(arm, lines, wall, returncode, timed_out, load_before) -> dict:
    steps = [(t, int(m.group(1))) for t, line in lines if (m := _STEP.search(line))]
    ready = next((t for t, line in lines if "ready after" in line), None)
    (t_first, first), (t_last, last) = steps[0], steps[-1]
    return {
        "arm": arm,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - wall)),
        "environment": ARMS[arm],
        "load_average_before": round(load_before, 2),
        "pretraining_steps_reached": last,
        "pretraining_steps_per_s": (last - first) / (t_last - t_first) if t_last > t_first else None,
        "base_model_ready_s": ready,
        "wall_time_s": wall,
        "timed_out": timed_out,
        "returncode": returncode,
        "target_reached": any(line.startswith("Target reached") for _, line in lines),
        "last_lines": [line for _, line in lines[-5:]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the demo (one core each)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds an arm may run before it is stopped")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "busy_machine.json"))
    args = parser.parse_args()
    report = {
        "command": "python benchmarks/busy_machine.py",
        "cores": os.cpu_count(),
        "load_processes": args.load,
        "time_limit_s": args.time_limit,
        "pretraining_steps": PRETRAIN_STEPS,
        "arms": {},
    }
    if os.path.exists(args.out):  # the other arm of an earlier run with the same settings is kept
        with open(args.out) as f:
            earlier = json.load(f)
        if {k: v for k, v in earlier.items() if k != "arms"} == {k: v for k, v in report.items() if k != "arms"}:
            report["arms"] = earlier["arms"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for arm in args.arms:
        report["arms"][arm] = run_arm(arm, args.load, args.time_limit)
        print(json.dumps(report["arms"][arm], indent=2), flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
