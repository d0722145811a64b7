"""docs/results/claims-sweep.md: the demo task's claims sweep, from its report (`summary.json`), every evaluation of
every trial (`curves.csv`) and the lr stage (`lr_choice.json`). Wins, ties, losses, best and collapses follow
`rllib_p3o.sweep.verdicts`."""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import pandas as pd

from results_check.page import Page
from results_check.pages._fmt import load_json, num, pm, span, table, words
from results_check.pages._paths import SWEEP
from rllib_p3o.sweep.verdicts import (
    COLLAPSE_DROP,
    COLLAPSE_RULE,
    TIE_RULE,
    all_tie,
    best_or_tied,
    collapsed,
    verdict,
)

METHODS = {
    "p3o": "P3O",
    "grpo_eps0.2": "GRPO ε 0.2",
    "grpo_eps0.4": "GRPO ε 0.4",
    "grpo_eps0.6": "GRPO ε 0.6",
    "p3o_no_cap": "P3O no cap",
    "p3o_no_kl": "P3O no KL",
}
GRPO = [m for m in METHODS if m.startswith("grpo")]
LR_SEEDS = 2  # the lr stage's seeds per method and peak (the grid's setting)
AS_VERB = {"wins": "beats", "ties": "ties with", "loses": "loses to"}


def _trials(root: str) -> pd.DataFrame:
    """One row per trial: last and best held-out from every evaluation in curves.csv, collapse by `COLLAPSE_RULE`."""
    curves = pd.read_csv(os.path.join(root, SWEEP, "curves.csv"))
    evals = curves.dropna(subset=["heldout"]).sort_values("iteration")
    per = evals.groupby(["stage", "method", "seed"], sort=False)
    trials = per.agg(
        first=("heldout", "first"), last=("heldout", "last"), best=("heldout", "max"), samples=("samples", "last")
    ).reset_index()
    errored = curves.groupby(["stage", "method", "seed"])["error"].any()
    trials["collapsed"] = [
        collapsed(t.last, t.best, bool(errored[t.stage, t.method, t.seed])) for t in trials.itertuples()
    ]
    return trials


def quotes(root: str) -> List[str]:
    report = load_json(root, f"{SWEEP}/summary.json")
    lr = load_json(root, f"{SWEEP}/lr_choice.json")
    trials = _trials(root)
    stages = list(dict.fromkeys(pd.DataFrame(report["summary"])["stage"]))  # the grid's order
    stats: Dict[str, Dict[str, Tuple[float, float]]] = {}
    for stage in stages:
        rows = trials[trials["stage"] == stage]
        per = rows.groupby("method")["last"]
        stats[stage] = {m: (per.get_group(m).mean(), per.get_group(m).std(), len(per.get_group(m))) for m in METHODS}
    seeds = trials.groupby(["stage", "method"]).size()
    assert seeds.nunique() == 1, "every regime × method has the same number of seeds"
    n_seeds = int(seeds.iloc[0])
    budget = trials["samples"].unique()
    assert len(budget) == 1, "every trial's last evaluation is at the same budget"
    n_lr_trials = len(lr["scores"]) * len(next(iter(lr["scores"].values()))) * LR_SEEDS
    out = [
        f"`rllib-p3o sweep --full --out runs/sweep` ({len(trials) + n_lr_trials} trials, "
        f"{report['wall_s'] / 60:.1f} min including preparation",
        f"{report['iterations']} iterations of 64 prompts × 8 completions per trial",
        f"the last one, at the budget, is after {num(budget[0])} completions ({report['iterations'] - 1} updates)",
    ]

    # The lr stage: the peak whose worse method does best.
    peaks = sorted(lr["scores"], key=float)
    worst = {p: min(lr["scores"][p].values()) for p in peaks}
    chosen = max(peaks, key=lambda p: worst[p])
    assert float(chosen) == lr["lr_peak"] == report["lr_peak"], "lr_choice.json's peak is the rule's"
    rows = []
    for p in peaks:
        s = lr["scores"][p]
        cells = []
        for m in ("p3o", "grpo_eps0.2"):
            cell = f"{s[m]:.3f}"
            if s[m] == 0:
                cell = f"**{cell}** (both seeds at 0)"
            cells.append(cell)
        rows.append([f"**{float(p):.0e} (chosen)**" if p == chosen else f"{float(p):.0e}", *cells])
    out += table(["peak lr", "P3O", "GRPO ε = 0.2"], [[r[0].replace("e-0", "e-"), *r[1:]] for r in rows])

    # The matrix: best or tied in bold, collapses counted.
    out.append(TIE_RULE)
    out.append(COLLAPSE_RULE)
    matrix = []
    for stage in stages:
        best = best_or_tied(stats[stage])
        cells = []
        for m in METHODS:
            cell = pm(*stats[stage][m])
            if m in best:
                cell = f"**{cell}**"
            n = int(trials[(trials["stage"] == stage) & (trials["method"] == m)]["collapsed"].sum())
            if n:
                cell += f" ({n}/{n_seeds} collapsed)"
            cells.append(cell)
        matrix.append([f"`{stage}`", *cells])
    out += table(["regime", *METHODS.values()], matrix)
    fell = trials[trials["collapsed"]]
    groups = fell.groupby(["method", "stage"]).agg(n=("seed", "size"), best=("best", "max"))
    # In the grid's order (regime, then method), whatever order the rows were read in.
    order = {k: i for i, k in enumerate((m, s) for s in stages for m in METHODS)}
    groups = groups.loc[sorted(groups.index, key=order.__getitem__)]
    out.append(
        f"{len(fell)} of {len(trials)} trials collapsed under this rule: "
        + words([f"`{m}` in `{s}` ({int(g.n)} of {n_seeds} seeds)" for (m, s), g in groups.iterrows()])
    )
    nokl_async = trials[(trials["method"] == "p3o_no_kl") & (trials["stage"] == "async_staleness_2")]
    out.append(
        f"`p3o_no_kl` in the async regime rose to {span(nokl_async['best'], 2)} and ended at "
        f"{span(nokl_async['last'], 3)}"
    )
    summary = pd.DataFrame(report["summary"])
    out.append(f"counts a collapse below the *first* held-out ({int(summary['collapses'].sum())} here)")
    reached = pd.DataFrame(report["trials"])["samples_to_target"]
    first_eval = report["completions_per_iteration"] * 4
    out.append(
        f"All {int(reached.notna().sum())} reached the {report['target']:g} target, {int((reached == reached.min()).sum())} "
        f"of them at the first evaluation after training started ({num(reached.min())} completions)"
    )
    assert reached.min() == first_eval
    start = report["startup"]
    out.append(f"which took {start['fresh_actor_setup_s_mean']:.1f} s on average ({start['fresh_trials']} trials)")
    out.append(f"in {start['reused_actor_setup_s_mean']:.2f} s on average ({start['reused_trials']} trials)")

    # The claims, each sentence from the verdicts.
    def v(stage: str, a: str, b: str) -> str:
        return verdict(stats[stage][a], stats[stage][b])

    def best_grpo(stage: str) -> str:
        return max(GRPO, key=lambda m: stats[stage][m][0])

    def cell(stage: str, m: str) -> str:
        return pm(*stats[stage][m])

    def names(items: List[str]) -> str:
        return words([f"`{x}`" for x in items])

    # A regime where every method is best or tied shows no difference: it counts for no method (`all_tie`).
    no_difference = [s for s in stages if all_tie(stats[s])]
    separating = [s for s in stages if s not in no_difference]
    p3o_vs_best = {s: v(s, "p3o", best_grpo(s)) for s in stages}
    holds = [s for s in separating if p3o_vs_best[s] != "loses"]
    loses = [s for s in separating if p3o_vs_best[s] == "loses"]
    out.append(
        f'*"P3O matches the best GRPO ε without tuning"*: **in {len(holds)} of {len(separating)} regimes'
        + (" that separate the methods" if no_difference else "")
        + ".**"
    )
    if no_difference:
        out.append(f"{names(no_difference)} show no difference between any of the methods")
    out.append(
        (
            f"P3O ties with or beats the best GRPO ε in {names(holds)}, and loses to it in "
            if holds
            else "P3O loses to the best GRPO ε in "
        )
        + words([f"`{s}` ({cell(s, 'p3o')} vs {cell(s, best_grpo(s))})" for s in loses])
    )
    eps02 = [s for s in separating if "grpo_eps0.2" in best_or_tied(stats[s])]
    not02 = [s for s in separating if s not in eps02]
    out.append(f"GRPO ε = 0.2 is best or tied in {len(eps02)} of {len(separating)} regimes")
    for s in not02:
        best = best_or_tied(stats[s])
        out.append(
            f"in `{s}` the best is {names(best)} alone"
            if len(best) == 1
            else f"in `{s}` the best or tied are {names(best)}"
        )

    t12 = "temperature_1.2"
    t12_collapses = int(trials[trials["stage"] == t12]["collapsed"].sum())
    t12_ess = summary[summary["stage"] == t12]["ess_mean"]
    t12_best = best_or_tied(stats[t12])
    out.append(
        f"no trial collapsed at T = 1.2 ({t12_collapses} of {len(trials[trials['stage'] == t12])}; mean ESS "
        f"{span(t12_ess, 2)}), and "
        + (
            f"all {len(t12_best)} methods are best or tied there, so it shows no difference"
            if all_tie(stats[t12])
            else f"{len(t12_best)} of the {len(METHODS)} methods are best or tied there: {names(t12_best)}"
        )
    )
    out.append(
        f"P3O {AS_VERB[p3o_vs_best[t12]]} GRPO ε {best_grpo(t12)[-3:]} there ({cell(t12, 'p3o')} vs {cell(t12, best_grpo(t12))})"
    )
    a = "async_staleness_2"
    against = words([f"{AS_VERB[v(a, 'p3o', g)]} GRPO ε {g[-3:]}" for g in GRPO])
    out.append(f"P3O ({cell(a, 'p3o')}) {against} ({span([stats[a][g][0] for g in GRPO], 3)})")
    out.append(
        f"{int(trials[(trials['stage'] == a) & (trials['method'] == 'p3o')]['collapsed'].sum())} P3O seeds collapsed"
    )
    for s in ("behavior_stronger", "behavior_weaker"):
        out.append(
            f"P3O {AS_VERB[p3o_vs_best[s]]} GRPO ε {best_grpo(s)[-3:]} ({cell(s, 'p3o')} vs {cell(s, best_grpo(s))})"
        )
    w = "behavior_weaker"
    out.append(f"`p3o_no_kl` {AS_VERB[v(w, 'p3o_no_kl', best_grpo(w))]} the best GRPO ε there ({cell(w, 'p3o_no_kl')})")
    ablation = {}
    for abl in ("p3o_no_kl", "p3o_no_cap"):
        by = ablation[abl] = {k: [s for s in separating if v(s, abl, "p3o") == k] for k in AS_VERB}
        out.append(
            f"`{abl}` against P3O: " + "; ".join(f"{k} in {len(by[k])} ({names(by[k])})" for k in AS_VERB if by[k])
        )

    # The headline of the ablations: which part changes the result, in how many regimes, and which way.
    def changes(abl: str, part: str) -> str:
        by = ablation[abl]
        moved = len(by["wins"]) + len(by["loses"])
        if not moved:
            return f"the {part} does not"
        ways = [f"for the {w} in {len(by[k])}" for k, w in (("wins", "better"), ("loses", "worse")) if by[k]]
        return f"removing the {part} changes the result in {moved} of {len(separating)} regimes ({', '.join(ways)})"

    out.append(f"on this task {changes('p3o_no_kl', 'KL term')}; {changes('p3o_no_cap', 'cap')}")
    worst_gap = max(stages, key=lambda s: abs(stats[s]["p3o_no_cap"][0] - stats[s]["p3o"][0]))
    out.append(f"largest gap: `{worst_gap}`, {cell(worst_gap, 'p3o_no_cap')} vs {cell(worst_gap, 'p3o')}")
    hi = peaks[-1]
    out.append(
        f"at the lr stage's highest peak ({float(hi):.0e}), GRPO ε = 0.2 ended at "
        f"{lr['scores'][hi]['grpo_eps0.2']:.1f} held-out with both seeds, while P3O's mean was "
        f"{lr['scores'][hi]['p3o']:.3f}".replace("e-0", "e-")
    )
    out.append(
        f"at the chosen {float(chosen):.0e}, GRPO ε = 0.2 scored higher ({lr['scores'][chosen]['grpo_eps0.2']:.3f} vs "
        f"{lr['scores'][chosen]['p3o']:.3f})".replace("e-0", "e-")
    )
    start_mean = summary["heldout_start_mean"].unique()
    assert len(start_mean) == 1
    fast = int((reached == reached.min()).sum())
    out.append(
        f"held-out {start_mean[0]:.2f} before training, and {fast} of {len(reached)} trials at ≥ {report['target']:g} "
        f"after {int(reached.min()) // report['completions_per_iteration']} updates"
    )
    assert COLLAPSE_DROP == 0.1
    return out


PAGE = Page(
    path="docs/results/claims-sweep.md",
    quotes=quotes,
    settings=(
        "`p3o`, `grpo` at ε ∈ {0.2, 0.4, 0.6}",
        "in six regimes on the demo task,",
        "3 seeds each",
        "for P3O and GRPO ε = 0.2 on the on-policy regime, 2 seeds each",
        "GRPO ε = 0.2",
        "GRPO ε 0.2",
        "GRPO ε 0.4",
        "GRPO ε 0.6",
        "ε = 0.2",
        "T = 1.2",
        "temperature-1.2",
        "async staleness 1–2",
        '*"50% of the rollouts from another model"*',
        "at 1 ± ε",
        "weight 1 − ESS",
        "3-token task",
        "one base model and 3 seeds",
        "`on_policy_4_steps`",
        "`temperature_1.2`",
        "`async_staleness_2`",
        "over 3 seeds",
    ),
)
