"""README.md's Results section: the figures it quotes from the results pages' files."""

from __future__ import annotations

from typing import List

from results_check.page import Page
from results_check.pages import addition, claims, provenance, staleness
from results_check.pages._fmt import load_json, num, pct, words
from results_check.pages._paths import BENCH, BENCH_RESULTS


def quotes(root: str) -> List[str]:
    demo = load_json(root, f"{BENCH_RESULTS}/demo_seeds.json")
    tool = load_json(root, f"{BENCH_RESULTS}/tool_use_seeds.json")
    soak = load_json(root, f"{BENCH_RESULTS}/soak.json")
    ratio = {
        t: load_json(root, f"{BENCH_RESULTS}/{f}.json")["ratio_project_over_peer"][f"2.44M, <= {t} tokens"][
            "best over best"
        ]
        for t, f in ((16, "peer_trl_16"), (128, "peer_trl_128_buckets64"))
    }
    its = tool["with_tool_iterations"]
    growth = max(run["growth"][p] for run in soak["runs"] for p in ("driver", "runner_1", "learner_1"))
    bench = claims.default_standing(root)
    _, best = bench["weaker_best"]
    headline = (
        f"P3O's default is within {claims.AIM_GAP:g} of the best method in {len(bench['held'])} of "
        f"{len(bench['regimes'])} regimes, {bench['weaker'][0]:.3f} with a weaker second model writing half of each "
        f"group (best: {best[0]:.3f})"
    )
    if bench["missed"]:
        headline += f", and misses in {words([f'`{r}`' for r in bench['missed']])}"
    standing = staleness.readme_standing(root)
    bench_report = load_json(root, f"{BENCH}/summary.json")
    bench_lr = load_json(root, f"{BENCH}/lr_choice.json")
    return [
        headline,
        *([standing] if standing else []),
        provenance.readme_development(root),
        *([confirmed] if (confirmed := provenance.readme_confirmation(root)) else []),
        *([dev] if (dev := addition.readme_development(root)) else []),
        *([both] if (both := addition.readme_both_tasks(root)) else []),  # once both tasks' confirmations are complete
        # The feature list's claims sweep: how the bench's lr was chosen, and the trials its command runs.
        f"on the claims bench's sorting task, P3O vs the baselines peers ship, {claims.lr_sentence(bench_lr)}",
        f"--out runs/bench # the claims bench: {bench_report['cost']['trials']} trials",
        f"{demo['num_reached']} of {demo['num_runs']} seed pairs reach held-out ≥ {demo['target']:g}, after a median "
        f"{demo['seconds_to_target']['median']:.0f} s of training",
        f"{tool['successes']} of {tool['total']} runs learn two-digit products to ≥ 0.9 in {its['min']}–{its['max']} "
        f"iterations; without it, none gets past {tool['without_tool_heldout_best']['max']:g}",
        f"({ratio[16]:.2f}× its step time at completions of up to 16 tokens, {ratio[128]:.2f}× at up to 128;",
        f"{num(soak['iterations'])} iterations in sync and async mode, no process growing by more than "
        f"{pct(growth, 1)} after warm-up",
        f"rllib-p3o 0.1.0, except precision, the soak, the benchmarks at lengths up to 512 tokens and the claims "
        f"bench ({soak['version']})",
    ]


PAGE = Page(
    path="README.md",
    quotes=quotes,
    settings=("2-core x86-64 CPUs", "at up to 512", "an AVX-512 one", "temperature 1.2,", "ran on one H200"),
    sections=("Results",),
    info_box=False,
)
