"""Shared by the benchmarks: write the JSON report (print it, shut Ray down); run an example script and read its
summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import List


def write_report(report: dict, path: str) -> None:
    import ray

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    ray.shutdown()


def run_example(script: str, out: str, args: List[str], log_name: str) -> dict:
    """Run ``examples/<script>`` with ``--out out`` and ``args`` in a subprocess (its output into ``out/log_name``);
    returns its summary.json plus ``returncode`` and ``wall_time_s``, or an ``error`` when it wrote none."""
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "examples", script), "--out", out, *args]
    t0 = time.time()
    with open(os.path.join(out, log_name), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        return {"returncode": rc, "error": f"no summary; see {out}/{log_name}"}
    with open(path) as f:
        summary = json.load(f)
    summary.update(returncode=rc, wall_time_s=time.time() - t0)
    return summary
