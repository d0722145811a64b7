"""Break, once each, the behavior a merged scenario's tests check, and see those tests fail (the file is restored
after each run). A scenario run once for several tests must still catch what each test was written for.

    .venv/bin/python -m devtools.break_merged [out.json]

Prints one line per break (pytest's exit status 1 and its summary: the tests failed, as they must) and the results as
JSON (to ``out.json`` if given). Runs the slow tests it names: a few minutes on 2 cores.
"""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BREAKS = [
    (
        "restore continues the prompt schedule",
        "rllib_p3o/data/prompt_schedule.py",
        "self.next_group = int(state[self.NEXT_GROUP])",
        "self.next_group = 0",
        [
            "tests/test_faults.py::test_restored_run_samples_what_the_uninterrupted_run_samples",
            "tests/test_faults.py::test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one_and_resumes_exactly",
        ],
    ),
    (
        "a behavior model writes its samples per group",
        "rllib_p3o/core/sources.py",
        'n = spec["samples"] if "samples" in spec',
        'n = spec["samples"] - 1 if "samples" in spec',
        ["tests/test_async_behavior.py::test_behavior_model_takes_its_share_of_every_group"],
    ),
    (
        "a sync run reports staleness 0",
        "rllib_p3o/core/metrics.py",
        "STALENESS_MAX: int(np.max(stale))",
        "STALENESS_MAX: int(np.max(stale)) + 1",
        ["tests/test_async_behavior.py::test_sync_run_drops_nothing_and_reports_zero_staleness"],
    ),
    (
        "validate exits 1 on a bad file",
        "rllib_p3o/cli/validate.py",
        "    return 0 if ok else 1\n",
        "    return 0\n",
        ["tests/test_offline.py::test_cli_exit_status"],
    ),
    (
        "compare fails on a differing training value",
        "rllib_p3o/sweep/compare.py",
        "            differing[name] = where",
        "            pass",
        [
            "tests/test_sweep.py::test_sweep_compare_ignores_the_machines_columns_fails_on_a_training_value_and_sets_two_runs_side_by_side"
        ],
    ),
]


def main() -> None:
    out = []
    failed_to_fail = []
    for what, path, old, new, tests in BREAKS:
        f = ROOT / path
        text = f.read_text()
        assert text.count(old) == 1, (path, old)
        f.write_text(text.replace(old, new))
        try:
            done = subprocess.run(
                [str(ROOT / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=1800,
            )
        finally:
            f.write_text(text)
        summary = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line][-1:]
        print(f"{what}: exit {done.returncode}; {summary}", flush=True)
        out.append({"break": what, "file": path, "tests": tests, "exit": done.returncode, "summary": summary})
        if done.returncode != 1:
            failed_to_fail.append(what)
    json.dump(out, sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"), indent=1)
    if failed_to_fail:
        sys.exit(f"not caught: {', '.join(failed_to_fail)}")


if __name__ == "__main__":
    main()
