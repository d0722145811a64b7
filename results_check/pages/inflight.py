"""docs/results/inflight.md: in-flight weight updates, from `inflight.json` (`python benchmarks/inflight.py`: sync,
async at chunk boundaries and in-flight side by side) and the claims bench's async regime with and without them
(`rllib-p3o sweep --task sorting --inflight`, `results/bench-inflight/summary.json`)."""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import pandas as pd

from results_check.page import Page
from results_check.pages._fmt import load_json, pct, pm, table
from results_check.pages._paths import BENCH_INFLIGHT, BENCH_RESULTS
from rllib_p3o.sweep.grid import GRIDS
from rllib_p3o.sweep.verdicts import standard_error, verdict

FILE = f"{BENCH_RESULTS}/inflight.json"
# The page's name of each mode, in the table's order.
MODES = (
    ("sync", "sync (generate, then train)"),
    ("async", "async at chunk boundaries"),
    ("inflight", "in-flight, prefix KV recomputed"),
    ("inflight_keep", "in-flight, prefix KV kept"),
)
AIM_SPEEDUP = 1.3  # the aim: in-flight at least this × async's throughput with spread lengths
AIM_IDLE = 0.10  # ... and the learner idle less than this share of the time
ASYNC, INFLIGHT = GRIDS["sorting", "inflight"].regimes


def benchmark_quotes(root: str) -> List[str]:
    report = load_json(root, FILE)
    out = [
        f"{report['steps']} steps per mode and repeat after {report['warmup_steps']} warm-up steps, "
        f"{report['repeats']} repeats",
    ]
    for cap, result in report["caps"].items():
        s = result["summary"]
        rows = [
            [
                label,
                f"{s[m]['tokens_per_s']:,.0f}",
                pct(s[m]["learner_idle_share"]),
                pct(s[m]["runner_idle_share"]),
                f"{s[m]['staleness_mean']:.2f}",
                pct(s[m]["spanning_share"]),
            ]
            for m, label in MODES
            if m in s
        ]
        out += table(
            ["mode", "tokens/s", "learner idle", "runner idle", "mean staleness", "completions spanning versions"],
            rows,
        )
        ratio = result["ratios"]["inflight_over_async_tokens_per_s"]
        keep = result["ratios"].get("inflight_keep_over_async_tokens_per_s")
        idle = s["inflight"]["learner_idle_share"]
        out.append(
            f"At up to {cap} tokens in-flight updates train {ratio:.2f}× the tokens per second of async at chunk "
            f"boundaries ({keep:.2f}× with the prefix KV kept)"
        )
        out.append(
            f"the aim of {AIM_SPEEDUP}× is {'met' if ratio >= AIM_SPEEDUP else 'missed'} and the learner is idle "
            f"{pct(idle)} of the time ({'under' if idle < AIM_IDLE else 'not under'} the aim of {pct(AIM_IDLE)})"
        )
        load = max(s[m].get("load_average_before_max", 0.0) for m in s)
        out.append(f"the one-minute load average before a run was at most {load:.1f}")
    return out


def _stats(summary: Dict) -> Dict[Tuple[str, str], Tuple[float, float, int, int]]:
    return {
        (r["stage"], r["method"]): (
            r["heldout_at_budget_mean"],
            r["heldout_at_budget_std"],
            int(r["seeds"]),
            int(r["collapses"]),
        )
        for r in summary["summary"]
    }


def bench_quotes(root: str) -> List[str]:
    path = os.path.join(root, BENCH_INFLIGHT, "summary.json")
    if not os.path.exists(path):
        return ["The bench's in-flight grid has not run yet"]
    summary = load_json(root, f"{BENCH_INFLIGHT}/summary.json")
    stats = _stats(summary)
    out = [summary["note"]] if summary.get("note") else []
    methods = list(dict.fromkeys(m for _, m in stats))
    rows = []
    for m in methods:
        if (ASYNC, m) not in stats or (INFLIGHT, m) not in stats:
            continue
        a, b = stats[ASYNC, m], stats[INFLIGHT, m]
        se = standard_error(a[1], a[2], b[1], b[2])
        v = verdict(b[:3], a[:3])
        rows.append(
            [
                f"`{m}`",
                pm(a[0], a[1]) + (f" ({a[3]}/{a[2]} collapsed)" if a[3] else ""),
                pm(b[0], b[1]) + (f" ({b[3]}/{b[2]} collapsed)" if b[3] else ""),
                f"{b[0] - a[0]:+.3f}",
                f"{se:.3f}",
                {"ties": "within the standard error", "wins": "higher", "loses": "lower"}[v],
            ]
        )
    out += table(
        ["method", f"`{ASYNC}`", f"`{INFLIGHT}`", "difference", "standard error", "in-flight"],
        rows,
    )
    curves_path = os.path.join(root, BENCH_INFLIGHT, "curves.csv")
    if os.path.exists(curves_path):
        curves = pd.read_csv(curves_path)
        age = curves.groupby("stage")["staleness_mean"].mean()
        out.append(
            f"The data's mean age in policy versions, over every trial and iteration: `{ASYNC}` {age[ASYNC]:.2f}, "
            f"`{INFLIGHT}` {age[INFLIGHT]:.2f} (a completion's age is its oldest token's)"
        )
    return out


def quotes(root: str) -> List[str]:
    return benchmark_quotes(root) + bench_quotes(root)


PAGE = Page(
    path="docs/results/inflight.md",
    quotes=quotes,
    settings=(
        "8 prompts × 8 completions per step",
        "geometric lengths of mean cap / 2",
        "seeds 0-2",
        "30 iterations of 512 completions",
        "`max_staleness` 4",
        "### Up to 128 tokens",
        "### Up to 512 tokens",
        "GRPO-clip at ε 0.2",
        "a learner idle less than 10% of the time",
    ),
)
