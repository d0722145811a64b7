"""docs/results/busy-machine.md: `make demo` beside a CPU-bound load, with OpenMP's spinning wait and with the passive
wait policy `import rllib_p3o` sets, from `busy_machine.json` (`python benchmarks/busy_machine.py`)."""

from __future__ import annotations

from typing import List

from results_check.page import Page
from results_check.pages._fmt import load_json, num, table
from results_check.pages._paths import BENCH_RESULTS

FILE = f"{BENCH_RESULTS}/busy_machine.json"
# The page's name of each arm, in the table's order.
ARMS = (("spin", "spinning (OpenMP's default, before)"), ("passive", "passive (the package's default)"))


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _ready(arm: dict, report: dict) -> str:
    if arm["base_model_ready_s"] is not None:
        return _clock(arm["base_model_ready_s"])
    return f"not within {_clock(arm['wall_time_s'])} (step {arm['pretraining_steps_reached']} of {num(report['pretraining_steps'])})"


def _demo(arm: dict) -> str:
    if arm["timed_out"]:
        return f"stopped at {_clock(arm['wall_time_s'])}"
    outcome = "target reached" if arm["target_reached"] else "target not reached"
    return f"{_clock(arm['wall_time_s'])}, {outcome}"


def quotes(root: str) -> List[str]:
    report = load_json(root, FILE)
    arms = report["arms"]
    rows = [
        [label, f"{arms[key]['pretraining_steps_per_s']:.2f}", _ready(arms[key], report), _demo(arms[key])]
        for key, label in ARMS
    ]
    spin, passive = (arms[key] for key, _ in ARMS)
    speedup = passive["pretraining_steps_per_s"] / spin["pretraining_steps_per_s"]
    return [
        f"pretrained for {num(report['pretraining_steps'])} steps",
        f"beside {report['load_processes']} processes that each keep a core busy",
        f"at most {_clock(report['time_limit_s'])} per arm",
        f"within its {report['time_limit_s'] / 60:.0f} minutes",
        *table(["OpenMP wait", "pretraining steps/s", "base model ready", "whole demo"], rows),
        f"The passive wait pretrains {speedup:.0f}× as fast",
        f"The load average was {spin['load_average_before']:.1f} before the spinning arm and "
        f"{passive['load_average_before']:.1f} before the passive one",
    ]


PAGE = Page(path="docs/results/busy-machine.md", quotes=quotes)
