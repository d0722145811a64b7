"""docs/results/faults.md: what a killed runner, a killed driver and a NaN batch cost, from `faults.json`
(`python benchmarks/faults.py`). The repeated runs' recovery times were not kept: that section says so."""

from __future__ import annotations

from typing import List

from results_check.page import Page
from results_check.pages._fmt import load_json, row
from results_check.pages._paths import BENCH_RESULTS

FILE = f"{BENCH_RESULTS}/faults.json"
KILL_AFTER = 3  # benchmarks/faults.py's runner_kill trains 3 iterations, then kills runner 1


def _counts(s: dict) -> List[str]:
    return [
        f"{s['iterations_lost']} / {s['iterations_duplicated']}",
        f"{s['prompts_replayed']} / {s['prompts_skipped']}",
    ]


def quotes(root: str) -> List[str]:
    report = load_json(root, FILE)
    # "tiny Qwen2, 40 arithmetic prompts, 4 prompts x 4 completions per iteration, 2 CPU cores"
    setting = report["setting"].replace(" x ", " × ").split(", ")
    runner, driver, nan = report["runner_kill"], report["driver_kill"], report["nan_injection"]
    runners = int(runner["healthy_runners_at_end"])
    restored_from = driver["killed_while_in_iteration"] - driver["iterations_redone"]
    assert nan["weights_unchanged_by_poisoned_step"] and nan["training_finite_afterwards"]
    steps = int(nan["skipped_nonfinite_steps"])
    return [
        f"The setting: the tiny test model, {setting[1]}, {setting[2]}, every sampled batch recorded.",
        row(
            [
                f"one of {runners} runners killed (SIGKILL) after iteration {KILL_AFTER}",
                *_counts(runner),
                f"{runner['samples_lost_and_resampled']:.0f} completions sampled again by the other runner in the "
                f"same iteration; runner back, with verified weights, {runner['seconds_to_recover']:.0f} s "
                f"({runner['iterations_until_restarted']} iterations) after the kill",
            ]
        ),
        row(
            [
                f"driver killed (SIGKILL) in iteration {driver['killed_while_in_iteration']} of a Tune run, then "
                "`Tuner.restore(..., resume_errored=True)`",
                f"{driver['iterations_lost']} / {driver['iterations_duplicated']} in `result.json` (an iteration "
                "counted twice if the kill lands during the save of a checkpoint)",
                f"{driver['prompts_replayed']} / {driver['prompts_skipped']}",
                f"iteration {driver['killed_while_in_iteration']} trained again from the checkpoint of "
                f"{restored_from}; first new result {driver['seconds_to_recover']:.0f} s after the restore began (Ray "
                "start, runner and engine, restore)",
            ]
        ),
        row(
            [
                "NaN advantage in one iteration's batch",
                *_counts(nan),
                f"{steps} step{'s' if steps != 1 else ''} skipped, weights unchanged by it, training finite afterwards",
            ]
        ),
    ]


PAGE = Page(path="docs/results/faults.md", quotes=quotes, unchecked={"Repeated runs": "their files were not kept"})
