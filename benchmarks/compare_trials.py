"""Whether a rerun of a sweep reproduced another's trials: every trial file found in both, compared value for value.

    python benchmarks/compare_trials.py docs/bench/trials runs/bench/trials [--json reproduction.json] [--complete]

A sweep's trial files (``<out>/trials/<stage>/<method>_seed<s>_lr<lr>.csv``) hold each iteration's held-out reward,
ESS, reward and sample count. Those are compared as written (the CSV's text, so "equal" means bit for bit); the
columns that measure the machine rather than the training (wall time, set-up time, whether a warm actor was reused)
are left out. Prints one line per differing or missing trial and a total; exits non-zero when a trial differs, or,
with ``--complete``, when the rerun lacks one of the reference's trials.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Dict, List, Optional

import pandas as pd

from rllib_p3o.sweep import report

# What the machine decides, not the training: excluded from the comparison.
MACHINE_COLUMNS = (report.TIME_S, report.SETUP_S, report.ACTOR_REUSED)


def trial_files(trials_dir: str) -> List[str]:
    """The trial files under a sweep's ``trials`` folder, as paths relative to it (``<stage>/<trial>.csv``)."""
    paths = glob.glob(os.path.join(trials_dir, "*", "*.csv"))
    return sorted(os.path.relpath(p, trials_dir) for p in paths)


def _training_columns(path: str) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return frame.drop(columns=[c for c in MACHINE_COLUMNS if c in frame.columns])


def first_difference(reference: str, rerun: str) -> Optional[str]:
    """None when the two trial files hold the same training values; else where they first differ."""
    a, b = _training_columns(reference), _training_columns(rerun)
    if list(a.columns) != list(b.columns):
        return f"columns differ: {list(a.columns)} vs {list(b.columns)}"
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)}"
    for i in range(len(a)):
        for column in a.columns:
            if a.at[i, column] != b.at[i, column]:
                return f"row {i + 1} ({report.ITERATION} {a.at[i, report.ITERATION]}), {column}: {a.at[i, column]} vs {b.at[i, column]}"
    return None


def compare(reference_dir: str, rerun_dir: str) -> Dict[str, object]:
    """Counts and the differing/missing trials of ``rerun_dir`` against ``reference_dir``."""
    reference, rerun = trial_files(reference_dir), set(trial_files(rerun_dir))
    differing = {}
    for name in reference:
        if name in rerun:
            where = first_difference(os.path.join(reference_dir, name), os.path.join(rerun_dir, name))
            if where is not None:
                differing[name] = where
    compared = [name for name in reference if name in rerun]
    return {
        "reference": reference_dir,
        "rerun": rerun_dir,
        "reference_trials": len(reference),
        "compared": len(compared),
        "identical": len(compared) - len(differing),
        "differing": differing,
        "missing_from_rerun": [name for name in reference if name not in rerun],
        "only_in_rerun": sorted(rerun - set(reference)),
        "columns_ignored": list(MACHINE_COLUMNS),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="the trials folder the results were published from")
    parser.add_argument("rerun", help="the trials folder of the rerun")
    parser.add_argument("--json", help="also write the comparison here")
    parser.add_argument("--complete", action="store_true", help="fail when the rerun lacks a reference trial")
    args = parser.parse_args(argv)
    result = compare(args.reference, args.rerun)
    for name, where in result["differing"].items():
        print(f"DIFFERS  {name}: {where}")
    for name in result["only_in_rerun"]:
        print(f"EXTRA    {name}")
    if args.complete:
        for name in result["missing_from_rerun"]:
            print(f"MISSING  {name}")
    print(
        f"{result['identical']} of {result['compared']} trials found in both are identical "
        f"({result['reference_trials']} in the reference, {len(result['missing_from_rerun'])} not in the rerun; "
        f"ignored: {', '.join(MACHINE_COLUMNS)})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    failed = bool(result["differing"]) or (args.complete and bool(result["missing_from_rerun"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
