"""What each loss did to the data in a sweep's trials: the learner's per-iteration diagnostics, read back from Tune's
result files and averaged per stage and method.

    python -m rllib_p3o.sweep.diagnostics --out runs/bench [--json results/bench/diagnostics.json]

The sweep's trial files (``<out>/trials``) keep held-out, ESS and reward only; Tune's ``result.json`` of every trial
run in ``<out>/<stage>/<trial>/`` has all of the learner's metrics. Per trial, the mean over its iterations of:
``seq_masked_fraction`` (share of valid tokens in rows `grpo_seq_mask` dropped), ``is_truncated_fraction`` (tokens
whose TIS weight was cut at C), ``clip_fraction`` (tokens the clip bound), ``ess`` (of πθ/π_b), ``mismatch_kl``
(the engine's log-probs against the learner's before the update), P3O's KL term (``kl_weight`` = 1 - ESS,
``kl_grad_share``: its share of the gradient w.r.t. the token log-probs, ``rejected_fraction``: tokens with
log(πθ/π_b) < -10) and the completions' mean length; then the mean over
the trials of each stage and method. Stages whose Tune folder is gone (a stage finished in an earlier session is not
run again) are left out, and the trial counts say how many trials each figure is over.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
from typing import Dict, List

from rllib_p3o.core import metrics

LEARNER = metrics.LEARNER
COLUMNS: Dict[str, tuple] = {
    "seq_masked_fraction": (*LEARNER, metrics.SEQ_MASKED_FRACTION),
    "is_truncated_fraction": (*LEARNER, "is_truncated_fraction"),
    "clip_fraction": (*LEARNER, "clip_fraction"),
    "ess": (*LEARNER, "ess"),
    "mismatch_kl": (*LEARNER, "mismatch_kl"),
    "kl_weight": (*LEARNER, metrics.KL_WEIGHT),
    "kl_grad_share": (*LEARNER, metrics.KL_GRAD_SHARE),
    "rejected_fraction": (*LEARNER, metrics.REJECTED_FRACTION),
    "completion_len": (metrics.P3O, "completion_len_mean"),
}
COMMAND = "python -m rllib_p3o.sweep.diagnostics"  # recorded in the --json file
TRIAL = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)_lr(?P<lr>[0-9.e-]+)$")


def _lookup(result: dict, path: tuple) -> float:
    value = metrics.lookup(result, *path)
    try:
        return float(value)
    except (TypeError, ValueError):  # missing (None) or not a number
        return math.nan


def _mean(values: List[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def trial_means(result_json: str) -> Dict[str, float]:
    """The mean over a trial's iterations of each of `COLUMNS`."""
    with open(result_json) as f:
        results = [json.loads(line) for line in f if line.strip()]
    return {name: _mean([_lookup(r, path) for r in results]) for name, path in COLUMNS.items()}


def diagnostics(out: str) -> List[dict]:
    """One row per stage and method: the trials found and the mean of each column over them."""
    stages = sorted(os.listdir(os.path.join(out, "trials")))
    rows = []
    for stage in stages:
        per_method: Dict[str, List[Dict[str, float]]] = {}
        for path in sorted(glob.glob(os.path.join(out, stage, "*", "result.json"))):
            match = TRIAL.match(os.path.basename(os.path.dirname(path)))
            if match:
                per_method.setdefault(match["method"], []).append(trial_means(path))
        for method, trials in per_method.items():
            rows.append(
                {
                    "stage": stage,
                    "method": method,
                    "trials": len(trials),
                    **{c: _mean([t[c] for t in trials]) for c in COLUMNS},
                }
            )
    return rows


def markdown(rows: List[dict]) -> str:
    lines = ["| stage | method | trials | " + " | ".join(COLUMNS) + " |", "|---" * (3 + len(COLUMNS)) + "|"]
    for r in rows:
        cells = ["–" if math.isnan(r[c]) else f"{r[c]:.3g}" for c in COLUMNS]
        lines.append(f"| {r['stage']} | {r['method']} | {r['trials']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rllib_p3o.sweep.diagnostics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="runs/bench", help="the sweep's --out")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = diagnostics(args.out)
    print(markdown(rows))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": COMMAND, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
