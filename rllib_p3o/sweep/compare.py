"""Whether a rerun of a sweep reproduced another's trials: every trial file found in both, compared value for value.

    python -m rllib_p3o.sweep.compare results/bench/trials runs/bench/trials [--json reproduction.json] [--complete]
        [--table replication.md]

A sweep's trial files (``<out>/trials/<stage>/<method>_seed<s>_lr<lr>.csv``) hold each iteration's held-out reward,
ESS, reward and sample count. Those are compared as written (the CSV's text, so "equal" means bit for bit); the
columns that measure the machine rather than the training (wall time, set-up time, whether a warm actor was reused,
the CPU) are left out. Prints one line per differing or missing trial and a total; exits non-zero when a trial
differs, or, with ``--complete``, when the rerun lacks one of the reference's trials.

On another CPU (AVX-512 against AVX2, say) the kernels round differently, the base model is not the same to the
last bit and no trial is identical; the question is then whether the results are. ``--table`` writes, from each
run's report (``summary.json`` beside its ``trials`` folder, from ``rllib-p3o sweep ... --report-only``), held-out
at the budget per regime and method side by side (mean ± std over seeds, collapses), each run's best in a regime in
bold, and per regime whether P3O's place against the best baseline is the same in both.
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
MACHINE_COLUMNS = (report.TIME_S, report.SETUP_S, report.ACTOR_REUSED, report.MACHINE)
P3O = "p3o"  # the method whose place in each regime the table checks


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
    compared = [name for name in reference if name in rerun]
    differing = {}
    for name in compared:
        where = first_difference(os.path.join(reference_dir, name), os.path.join(rerun_dir, name))
        if where is not None:
            differing[name] = where
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


def _summary(trials_dir: str) -> Dict[tuple, dict]:
    path = os.path.join(os.path.dirname(os.path.abspath(trials_dir)), report.SUMMARY_JSON)
    with open(path) as f:
        return {(row[report.STAGE], row[report.METHOD]): row for row in json.load(f)["summary"]}


def _cell(row: Optional[dict], best: set) -> str:
    return "–" if row is None else report.matrix_cell(row, row[report.METHOD] in best)


def _p3o_gap(rows: Dict[str, dict]) -> Optional[float]:
    """P3O's held-out at the budget minus the best other method's (None: no P3O or no other method)."""
    others = [r["heldout_at_budget_mean"] for m, r in rows.items() if m != P3O]
    return rows[P3O]["heldout_at_budget_mean"] - max(others) if P3O in rows and others else None


def replication_table(reference_dir: str, rerun_dir: str) -> str:
    """Held-out at the budget of both runs per regime and method, and P3O's gap to the best other method in each."""
    reference, rerun = _summary(reference_dir), _summary(rerun_dir)
    regimes = list(dict.fromkeys(stage for stage, _ in [*reference, *rerun]))
    lines = [
        f"Held-out at the budget, mean ± std over seeds, each method at its best lr in its own run; reference: "
        f"`{reference_dir}`, rerun: `{rerun_dir}`.",
        "",
        "| regime | method | reference | rerun | Δ mean |",
        "|---|---|---|---|---|",
    ]
    gaps = ["| regime | P3O − best other (reference) | P3O − best other (rerun) | same sign |", "|---|---|---|---|"]
    for regime in regimes:
        ref = {m: r for (s, m), r in reference.items() if s == regime}
        new = {m: r for (s, m), r in rerun.items() if s == regime}
        best_ref, best_new = set(report.best_methods(ref)), set(report.best_methods(new))
        for method in dict.fromkeys([*ref, *new]):
            a, b = ref.get(method), new.get(method)
            delta = f"{b['heldout_at_budget_mean'] - a['heldout_at_budget_mean']:+.3f}" if a and b else "–"
            lines.append(f"| {regime} | {method} | {_cell(a, best_ref)} | {_cell(b, best_new)} | {delta} |")
        ga, gb = _p3o_gap(ref), _p3o_gap(new)
        if ga is not None and gb is not None:
            gaps.append(f"| {regime} | {ga:+.3f} | {gb:+.3f} | {'yes' if (ga >= 0) == (gb >= 0) else 'no'} |")
    return "\n".join(lines) + "\n\n" + "\n".join(gaps) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rllib_p3o.sweep.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="the trials folder the results were published from")
    parser.add_argument("rerun", help="the trials folder of the rerun")
    parser.add_argument("--json", help="also write the comparison here")
    parser.add_argument("--complete", action="store_true", help="fail when the rerun lacks a reference trial")
    parser.add_argument("--table", help="write both runs' results side by side here (markdown; needs their reports)")
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
    if args.table:
        with open(args.table, "w") as f:
            f.write(replication_table(args.reference, args.rerun))
        print(f"side by side: {args.table}")
    failed = bool(result["differing"]) or (args.complete and bool(result["missing_from_rerun"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
