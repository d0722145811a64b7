"""Shared end of every benchmark: write the JSON report, print it, shut Ray down."""

from __future__ import annotations

import json
import os


def write_report(report: dict, path: str) -> None:
    import ray

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    ray.shutdown()
