"""docs/results/tool-use.md: the tool-use example over base-model × RL seeds, from `tool_use_seeds.json`
(`python benchmarks/tool_use_seeds.py`); the base model's corpus from `build_tool_model`'s defaults. The curves' run
kept no metrics file: what the page reads off its figure is in a section that says so."""

from __future__ import annotations

import statistics
from typing import List

from results_check.page import Page
from results_check.pages._code import defaults
from results_check.pages._fmt import load_json, pct, span, table
from results_check.pages._paths import BENCH_RESULTS

FILE = f"{BENCH_RESULTS}/tool_use_seeds.json"
MIN_WITHOUT = 10  # examples/tool_use.py: the run without the calculator trains max(10, 3 × the first run's) iterations


def quotes(root: str) -> List[str]:
    report = load_json(root, FILE)
    runs = report["runs"]
    with_, without = [r["with_tool"] for r in runs], [r["without_tool"] for r in runs]
    assert len({w["target"] for w in with_}) == 1
    assert all(w["iterations"] == max(MIN_WITHOUT, 3 * r["with_tool"]["iterations"]) for r, w in zip(runs, without))
    before, its, train = report["with_tool_heldout_before"], report["with_tool_iterations"], report["with_tool_train_s"]
    best = report["without_tool_heldout_best"]
    share = defaults(root, "rllib_p3o/tasks/products.py", "build_tool_model")["tool_fraction"]
    out = [
        f"answered directly ({pct(1 - share)}) or with the calculator ({pct(share)})",
        f"(greedy held-out accuracy about {before['median']:.1f})",
        f"until held-out accuracy reaches {with_[0]['target']:g}, then WITHOUT it",
        f"**{report['successes']} of {report['total']} runs reached held-out ≥ {with_[0]['target']:g} with the "
        f"calculator**, from {span([before['min'], before['max']], 2)} before RL, after {its['min']}–{its['max']} "
        f"iterations",
        f"and {span([train['min'], train['max']], 1)} s of training (median {train['median']:.1f} s). **Without it, no "
        f"run got past {best['max']:g}** in {span([w['iterations'] for w in without], 0)} iterations (median best "
        f"{best['median']:.3f})",
        f"Each run took {span([r['wall_time_s'] for r in runs], 0)} s",
    ]
    assert report["successes"] == sum(r["success"] for r in runs)
    assert statistics.median(w["heldout_max"] for w in without) == best["median"]
    rows = [
        [
            r["base_seed"],
            r["rl_seed"],
            f"{w['heldout_before']:.3f} → {w['heldout_after']:.3f}, {w['iterations']}, {w['train_time_s']:.1f} s",
            f"{wo['heldout_max']:.3f} ({wo['iterations']})",
        ]
        for r, w, wo in zip(runs, with_, without)
    ]
    out += table(
        [
            "base seed",
            "RL seed",
            "with calculator: held-out before → after, iterations, training time",
            "without: best held-out (iterations)",
        ],
        rows,
    )
    # The figure's run (base seed 0, RL seed 0) is the table's first row again.
    first = next(r for r in runs if r["base_seed"] == 0 and r["rl_seed"] == 0)
    out.append(
        f"The figure is the example's run with base seed {first['base_seed']} and RL seed {first['rl_seed']}, which "
        f"the table's row repeats to the same accuracies and iteration counts: without the calculator its held-out "
        f"accuracy falls to {first['without_tool']['heldout_after']:.3f}."
    )
    return out


PAGE = Page(
    path="docs/results/tool-use.md",
    quotes=quotes,
    settings=(
        "a 0.3M-parameter model",
        "(at least 10)",
        "(32 prompts × 8 episodes each)",
        "on 2 cores",
        "and exits 1 unless",
    ),
    unchecked={"Read off the figure": "the curves' run kept no metrics file"},
)
