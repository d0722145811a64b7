"""docs/results/precision.md: fp32, bf16 and simulated-FP8 rollouts, from `precision.json`
(`python benchmarks/precision.py`). Means ± sample std over seeds; ties by `rllib_p3o.sweep.verdicts`."""

from __future__ import annotations

import statistics
from itertools import combinations
from typing import List

from results_check.page import Page
from results_check.pages._fmt import load_json, num, table, words
from results_check.pages._paths import BENCH_RESULTS
from rllib_p3o.sweep.verdicts import TIE_RULE, standard_error, verdict

FILE = f"{BENCH_RESULTS}/precision.json"
COMPLETIONS_PER_ITERATION = 64 * 8  # the demo's setting
AS_VERB = {"wins": "beats", "ties": "ties with", "loses": "loses to"}


def _sci(x: float) -> str:
    """``1.6e-12``, ``8.7e-4`` (the exponent without padding)."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def quotes(root: str) -> List[str]:
    report = load_json(root, FILE)
    settings = report["settings"]
    first = next(iter(settings.values()))
    seeds = len(first["runs"])
    budget = first["runs"][0]["heldout"][-1][0]
    assert all(r["heldout"][-1][0] == budget for s in settings.values() for r in s["runs"])
    out = [
        f"**Version:** rllib-p3o {report['version']}",
        f"fixed budget of {budget} iterations ({num(budget * COMPLETIONS_PER_ITERATION)} completions) with {seeds} RL "
        "seeds",
        f"Medians over all {seeds * budget} iterations ({seeds} seeds × {budget}) of each setting.",
    ]
    med = {name: s["median_per_iteration"] for name, s in settings.items()}
    rows = []
    for name, m in med.items():
        rows.append(
            [
                name,
                _sci(m["mismatch_kl"]),
                _sci(m["mismatch_prob_abs_diff"]),
                f"{m['mismatch_ess']:.6f}",
                _sci(m["probe_max_abs_diff"]) if m["probe_max_abs_diff"] < 1e-3 else f"{m['probe_max_abs_diff']:.3f}",
                f"{m['sync_bytes'] / 1e6:.2f} MB",
                f"{m['sync_s']:.3f}",
                num(m["generated_tokens_per_s"]),
                f"{m['learner_update_s']:.3g}",
            ]
        )
    out += table(
        [
            "setting",
            "`mismatch_kl`",
            "`mismatch_prob_abs_diff`",
            "`mismatch_ess`",
            "probe max \\|diff\\|",
            "bytes per sync",
            "seconds per sync",
            "generated tokens/s",
            "learner update, s",
        ],
        rows,
    )
    fp32, bf16, fp8 = med["fp32"], med["bf16"], med["fp8_simulated"]
    out += [
        f"(KL {_sci(fp32['mismatch_kl'])}, |Δp| {_sci(fp32['mismatch_prob_abs_diff'])}, ESS "
        f"{fp32['mismatch_ess']:.1f} to six digits)",
        f"KL {_sci(bf16['mismatch_kl'])} per token, the fresh tokens' ESS {bf16['mismatch_ess']:.4f}",
        f"widen it {fp8['mismatch_kl'] / bf16['mismatch_kl']:.1f}×: KL {_sci(fp8['mismatch_kl'])}, ESS "
        f"{fp8['mismatch_ess']:.4f}",
        f"in bf16 ({fp32['sync_bytes'] / 1e6:.2f} → {bf16['sync_bytes'] / 1e6:.2f} MB)",
        f"({num(bf16['generated_tokens_per_s'])} vs {num(fp32['generated_tokens_per_s'])} generated tokens/s)",
        f"({bf16['learner_update_s']:.2f} vs {fp32['learner_update_s']:.2f} s per update, "
        f"{bf16['learner_update_s'] / fp32['learner_update_s']:.0f}×)",
        f"had a median of {bf16['probe_max_abs_diff']:.2f} in bf16",
        f"every run trained its {budget} iterations, {len(settings) * seeds * budget} syncs",
    ]

    # Learning: per seed, mean ± sample std (ddof 1), and the verdicts between settings.
    stats = {}
    rows = []
    for name, s in settings.items():
        final = [r["heldout_final"] for r in s["runs"]]
        before = statistics.mean(s["heldout_before"])
        stats[name] = (statistics.mean(final), statistics.stdev(final), len(final))
        rows.append(
            [
                name,
                f"{before:.3f}",
                ", ".join(f"{x:.3f}" for x in final),
                f"{stats[name][0]:.3f} ± {stats[name][1]:.3f}",
            ]
        )
    out += table(
        [
            "setting",
            "held-out before",
            f"at {num(budget * COMPLETIONS_PER_ITERATION)} completions, per seed",
            "mean ± std",
        ],
        rows,
    )
    learned = sum(r["heldout_final"] > r["heldout"][0][1] for s in settings.values() for r in s["runs"])
    out += [f"deviation over the {seeds} seeds", f"and {seeds} seeds cannot"]
    out.append(f"All {learned} runs end above their held-out before training")
    out.append(TIE_RULE)
    out.append("; ".join(f"`{a}` {AS_VERB[verdict(stats[a], stats[b])]} `{b}`" for a, b in combinations(settings, 2)))
    # What the verdicts say about the precision gap: whether a lower precision loses to fp32.
    lower = [name for name in settings if name != "fp32"]
    lost = [name for name in lower if verdict(stats[name], stats["fp32"]) == "loses"]
    out.append(
        f"{'Neither' if len(lower) == 2 else 'No'} lower precision loses to fp32, so on this task the precision gap "
        "does not hurt P3O"
        if not lost
        else f"{words([f'`{n}`' for n in lost])} {'loses' if len(lost) == 1 else 'lose'} to fp32"
    )
    top = max(stats, key=lambda name: stats[name][0])
    beaten = [name for name in stats if name != top and verdict(stats[top], stats[name]) == "wins"]
    if beaten:
        leads = [
            f"`{name}` by {stats[top][0] - stats[name][0]:.3f} (standard error of the difference "
            f"{standard_error(stats[top][1], stats[top][2], stats[name][1], stats[name][2]):.3f})"
            for name in beaten
        ]
        top_runs = [r["heldout_final"] for r in settings[top]["runs"]]
        out.append(
            f"`{top}` leads {words(leads)}, over {seeds} seeds that spread from {min(top_runs):.3f} to "
            f"{max(top_runs):.3f}"
        )
    fp8_before = statistics.mean(settings["fp8_simulated"]["heldout_before"])
    out.append(f"(the FP8-rounded base model answers {fp8_before:.3f} greedily)")
    return out


PAGE = Page(
    path="docs/results/precision.md",
    quotes=quotes,
    settings=(
        "64 prompts × 8 completions per iteration, 2 optimizer steps per iteration",
        "(0.3M parameters, tied embeddings), 1 vLLM runner",
        "every 5 iterations",
        "(staleness 0)",
        "the per-token bound `0.08 + 0.1 · |log-prob|` and the mean bound 0.08",
        "On 1-3-token answers",
        "The demo task's answers are 1-3 tokens",
    ),
)
