"""docs/results/claims.md: the claims bench (sorting task, one optimizer step per rollout batch), from the sweep's
report (`summary.json`), its lr stage (`lr_choice.json`) and every iteration of every trial (`curves.csv`, the trial
files' rows); the earlier two-step grid from its own report. Wins, ties, losses, best and collapses follow
`rllib_p3o.sweep.verdicts`; the sentences per regime are the report's own
(`rllib_p3o.sweep.report.verdict_sentences`).

The page's quotes come section by section, in page order (`SECTIONS`): each section is a function of the bench's
files (`Bench`) that returns the text the section must contain. A new section of the page is a new function appended
to `SECTIONS` (or inserted at its place); it may read files of its own under ``Bench.root``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from results_check.page import Page
from results_check.pages._fmt import load_json, pct, pm, span, table, words
from results_check.pages._paths import BENCH, BENCH_TWO_STEP
from rllib_p3o.sweep.verdicts import COLLAPSE_RULE, TIE_RULE, all_tie, best_or_tied, standard_error, verdict

DEFAULT = "p3o_default"  # P3O with its shipped settings (rllib_p3o.sweep.grid.METHODS)
DEFAULT_TWIN = "p3o_k3_is"  # the method whose lr p3o_default trains at (the grid's twin), named first when it is one
AIM_GAP = 0.05  # the aim: within 0.05 of the best method in every regime
AIM_WEAKER = 0.75  # ... and at least this with the weaker behavior model
WEAKER, STRONGER, ASYNC, TWO_STEPS = "behavior_weaker", "behavior_stronger", "async_staleness_4", "two_steps_per_batch"
OFFLINE = "offline_stale"
DIAGNOSTIC_METHODS = ("p3o_k3", "p3o_k3_is", DEFAULT)
EPS_FAMILIES = ("grpo_tis", "grpo_seq_mask")  # clipped against π_old: ε is inert with one optimizer step per batch
LR_SEEDS = 2  # the lr stage's seeds per method and peak (the grid's setting)
# A trial's columns that training writes (not the machine's: wall time, set-up); the same run has them all equal.
TRAINING_COLUMNS = ("heldout", "reward", "ess", "kl_weight", "kl_grad_share", "rejected_fraction")
COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}

Stats = Dict[str, Dict[str, Tuple[float, float, int]]]  # regime -> method -> (mean, sample std, seeds) at the budget


@dataclasses.dataclass(frozen=True)
class Bench:
    """The claims bench's committed files, read once for every section of the page."""

    root: str
    report: Mapping
    lr: Mapping
    rows: Dict[Tuple[str, str], Mapping]  # (regime, method) -> the report's summary row
    regimes: List[str]
    methods: List[str]
    stats: Stats
    curves: pd.DataFrame  # every iteration of every trial (curves.csv: the trial files' rows, the lr stage's too)
    trial_rows: Dict[Tuple[str, str], pd.DataFrame]  # (stage, method) -> its trials' rows, by seed and iteration

    def runs(self, regime: str) -> List[List[str]]:
        """`same_runs` of ``regime``, each group in page order."""
        return same_runs(self.trial_rows, regime, _order([m for m in self.methods if m in self.stats[regime]]))


def _require(condition: bool, what: str) -> None:
    """A fact of the files the page's text rests on: a ValueError (the check reports it as a problem) when not."""
    if not condition:
        raise ValueError(what)


def _rows(report: Mapping) -> Dict[Tuple[str, str], Mapping]:
    return {(r["stage"], r["method"]): r for r in report["summary"]}


def _stats(report: Mapping) -> Tuple[List[str], List[str], Stats]:
    rows = _rows(report)
    regimes = list(dict.fromkeys(s for s, _ in rows))
    methods = list(dict.fromkeys(m for _, m in rows))
    stats: Stats = {r: {} for r in regimes}
    for (s, m), row in rows.items():
        stats[s][m] = (row["heldout_at_budget_mean"], row["heldout_at_budget_std"], int(row["seeds"]))
    return regimes, methods, stats


def load(root: str) -> Bench:
    report = load_json(root, f"{BENCH}/summary.json")
    regimes, methods, stats = _stats(report)
    curves = pd.read_csv(os.path.join(root, BENCH, "curves.csv"))
    return Bench(
        root=root,
        report=report,
        lr=load_json(root, f"{BENCH}/lr_choice.json"),
        rows=_rows(report),
        regimes=regimes,
        methods=methods,
        stats=stats,
        curves=curves,
        trial_rows={
            key: rows.sort_values(["seed", "iteration"])
            for key, rows in curves.groupby(["stage", "method"], sort=False)
        },
    )


def _order(methods: Sequence[str]) -> List[str]:
    """P3O's default first, then P3O's other forms, then the baselines (in the grid's order)."""
    p3o = [m for m in methods if m.startswith("p3o") and m != DEFAULT]
    return [m for m in (DEFAULT, *p3o, *[m for m in methods if not m.startswith("p3o")]) if m in methods]


def _best(stats: Mapping[str, Tuple[float, float, int]]) -> str:
    """The method with the highest mean; P3O's default where its run is that method's (the same mean)."""
    return max(stats, key=lambda m: (stats[m][0], m == DEFAULT))


def _names(items: Sequence[str]) -> str:
    return words([f"`{x}`" for x in items])


def _cell(report_rows, regime: str, method: str, bold: bool) -> str:
    row = report_rows.get((regime, method))
    if row is None:
        return "–"
    text = pm(row["heldout_at_budget_mean"], row["heldout_at_budget_std"])
    text = f"**{text}**" if bold else text
    if row["collapses"]:
        text += f" ({row['collapses']}/{row['seeds']} collapsed)"
    return text


TrialRows = Mapping[Tuple[str, str], pd.DataFrame]


def _trial_columns(trial_rows: TrialRows, regime: str, method: str, columns: Sequence[str]) -> np.ndarray:
    return trial_rows[regime, method][["seed", "iteration", *columns]].to_numpy(dtype=float)


def same_runs(trial_rows: TrialRows, regime: str, methods: Sequence[str]) -> List[List[str]]:
    """``methods`` of ``regime`` grouped by their runs: two methods are in one group when every seed's held-out is
    equal at every evaluation (the trials computed the same policy, whatever the methods' names). Groups in the order
    of their first method."""
    groups: Dict[bytes, List[str]] = {}
    for m in methods:
        key = _trial_columns(trial_rows, regime, m, ["heldout"])
        key = key[~np.isnan(key[:, 2])]
        groups.setdefault(key.tobytes(), []).append(m)
    return list(groups.values())


def identical(trial_rows: TrialRows, regime: str, methods: Sequence[str]) -> bool:
    """Whether the methods' trials in ``regime`` hold equal values in every training column, every iteration."""
    first = _trial_columns(trial_rows, regime, methods[0], TRAINING_COLUMNS)
    return all(
        np.array_equal(first, _trial_columns(trial_rows, regime, m, TRAINING_COLUMNS), equal_nan=True)
        for m in methods[1:]
    )


def default_standing(root: str) -> Dict[str, object]:
    """Where P3O's default stands on the bench (README's headline and this page's summary): the regimes where it is
    within `AIM_GAP` of the best method and where not, and its held-out with the weaker behavior model beside the
    best method's there."""
    regimes, _, stats = _stats(load_json(root, f"{BENCH}/summary.json"))
    gaps = {r: stats[r][DEFAULT][0] - stats[r][_best(stats[r])][0] for r in regimes}
    return {
        "regimes": regimes,
        "held": [r for r in regimes if gaps[r] >= -AIM_GAP],
        "missed": [r for r in regimes if gaps[r] < -AIM_GAP],
        "weaker": stats[WEAKER][DEFAULT],
        "weaker_best": (_best(stats[WEAKER]), stats[WEAKER][_best(stats[WEAKER])]),
    }


def _lr_bracket(lr: Mapping) -> Tuple[List[str], bool]:
    """The lr stage's peaks (low to high) and whether every method's best was the highest (``lr``: lr_choice.json)."""
    peaks = sorted(next(iter(lr["scores"].values())), key=float)
    return peaks, {float(p) for p in lr["lr_peak"].values()} == {float(peaks[-1])}


def lr_sentence(lr: Mapping) -> str:
    """How each method's lr was chosen, and what the choice does not show (``lr``: lr_choice.json; README quotes
    it too)."""
    peaks, at_top = _lr_bracket(lr)
    n = COUNT_WORDS.get(len(peaks), str(len(peaks)))
    if at_top:
        return (
            f"each at the best of {n} peak learning rates; every method's best was the highest of them, so its best "
            "may lie above the range tried"
        )
    return f"each at the best of {n} peak learning rates"


# The page's sections, in page order: each returns the quotes of its section.


def setup_quotes(b: Bench) -> List[str]:
    """The info box and the task: the command, the trials it ran, the budget, the base model's held-out."""
    _require(not b.report["note"], "the page reports the full grid (the report says none is missing)")
    trials = b.report["trials"]
    lr_trials = len(b.lr["scores"]) * len(next(iter(b.lr["scores"].values()))) * LR_SEEDS
    reused = len({m for m in b.lr["scores"]}) * LR_SEEDS  # the lr stage's trials at the chosen peak: seeds 0, 1
    _require(
        b.report["cost"]["trials"] == len(trials) + lr_trials - reused,
        "the trials run are the regime stages' and the lr stage's, its trials at the chosen peak counted once",
    )
    out = [
        f"`rllib-p3o sweep --task sorting --full --parallel 2 --out runs/bench` ({b.report['cost']['trials']} trials",
        f"{b.report['cost']['trial_time_s_sum'] / 3600:.2f} h of trial time",
        f"{b.report['iterations']} iterations of 64 prompts × 8 completions",
    ]
    # The base model, per seed (the same at iteration 1 for every method: nothing has trained yet).
    first: Dict[int, set] = {}
    for t in trials:
        if t["stage"] == "on_policy":
            first.setdefault(t["seed"], set()).add(round(t["heldout_first"], 3))
    _require(all(len(v) == 1 for v in first.values()), "every method starts from the same held-out per seed")
    base = [f"{next(iter(first[s])):.3f}" for s in sorted(first)]
    out.append(f"held-out at iteration 1 is {words(base)} under seeds {words([str(s) for s in sorted(first)])}")
    return out


def lr_quotes(b: Bench) -> List[str]:
    """The lr stage: every method's best peak, and what the bracket does not show."""
    lr = b.lr
    peaks, at_top = _lr_bracket(b.lr)
    top = float(peaks[-1])
    at_top_scores = [lr["scores"][m][peaks[-1]] for m in lr["scores"]]
    same = {p: len({round(lr["scores"][m][p], 6) for m in lr["scores"]}) for p in peaks}
    out = [
        (
            f"every method's best peak was {top:.0e}, the highest of the three".replace("e-0", "e-")
            if at_top
            else "the methods' best peaks differ"
        )
        + f" (mean held-out at the budget {span(at_top_scores, 3)} there across the {len(lr['scores'])} methods)",
        f"at the lowest peak all {len(lr['scores'])} methods scored the same "
        f"({lr['scores'][next(iter(lr['scores']))][peaks[0]]:.3f})",
        lr_sentence(b.lr),
    ]
    _require(same[peaks[0]] == 1, "at the lowest peak every method scored the same")
    return out


def results_quotes(b: Bench) -> List[str]:
    """The matrix (best or tied in bold, collapses counted), the rules, and the collapses."""
    rows, regimes, stats = b.rows, b.regimes, b.stats
    trials = b.report["trials"]
    best = {r: set(best_or_tied(stats[r])) for r in regimes}
    out = [lr_sentence(b.lr)]
    out += table(
        ["method", *[f"`{r}`" for r in regimes]],
        [[f"`{m}`", *[_cell(rows, r, m, m in best[r]) for r in regimes]] for m in _order(b.methods)],
    )
    out += [TIE_RULE, COLLAPSE_RULE]
    collapsed = [t for t in trials if t["collapsed"]]
    runs = {r: b.runs(r) for r in regimes}
    seeds = {r: {m: rows[r, m]["seeds"] for m in stats[r]} for r in regimes}
    distinct = sum(seeds[r][group[0]] for r in regimes for group in runs[r])
    distinct_collapsed = sum(rows[r, group[0]]["collapses"] for r in regimes for group in runs[r])
    out.append(
        f"{len(collapsed)} of {len(trials)} regime-stage trials collapsed ({distinct_collapsed} of {distinct} counted "
        "once per run"
    )
    wide = [(r, m) for r in regimes for m in best[r] if rows[r, m]["collapses"]]
    out.append(
        "Under this rule a method with a wide spread can tie with the best while one of its seeds collapsed"
        if wide
        else "No method that is best or tied in a regime had a collapsed seed"
    )
    no_difference = [r for r in regimes if all_tie(stats[r])]
    out.append(
        f"{_names(no_difference)} show no difference between the methods"
        if no_difference
        else "Every regime separates some methods from the best (none has every method best or tied)"
    )
    return out


def same_run_quotes(b: Bench) -> List[str]:
    """Which methods ran the same trial in which regime (checked on every evaluation of every seed), and what the
    counts are once each run is counted once."""
    regimes, stats = b.regimes, b.stats
    out: List[str] = []
    table_rows = []
    near: List[Tuple[str, List[str]]] = []
    for r in regimes:
        groups = b.runs(r)
        cells = []
        for group in (g for g in groups if len(g) > 1):
            exact = identical(b.trial_rows, r, group)
            if not exact:
                near.append((r, group))
            cells.append((" = " if exact else " ≈ ").join(f"`{m}`" for m in group))
        best = set(best_or_tied(stats[r]))
        best_runs = sum(1 for g in groups if best & set(g))
        table_rows.append(
            [f"`{r}`", "; ".join(cells) or "–", f"{len(groups)} of {len(stats[r])}", f"{best_runs} of {len(groups)}"]
        )
    out += table(["regime", "the same run under several names", "runs of methods", "best or tied, in runs"], table_rows)

    # P3O's default: whose run it is in each regime.
    twin_of: Dict[str, str] = {}
    exactly = True
    for r in regimes:
        group = next(g for g in b.runs(r) if DEFAULT in g)
        others = [m for m in group if m != DEFAULT]
        if others:
            exactly = exactly and identical(b.trial_rows, r, group)
            twin_of[r] = DEFAULT_TWIN if DEFAULT_TWIN in others else others[0]
    by_twin: Dict[str, List[str]] = {}
    for r, twin in twin_of.items():
        by_twin.setdefault(twin, []).append(r)
    parts = sorted(by_twin.items(), key=lambda kv: len(kv[1]))
    said = []
    for i, (twin, where) in enumerate(parts):
        rest = i == len(parts) - 1 and len(parts) > 1 and len(twin_of) == len(regimes)
        place = f"the other {len(where)} regimes" if rest else _names(where)
        said.append(f"what `{twin}` computes in {place}" if exactly else f"`{twin}` in {place}")
    alone = [r for r in regimes if r not in twin_of]
    out.append(
        f"`{DEFAULT}` {'computed exactly' if exactly else 'had the same held-out as'} {words(said)}"
        + (f", and ran a trial of its own in {_names(alone)}" if alone else "")
    )
    # The clip ranges of the losses clipped against π_old.
    eps = []
    for i, family in enumerate(EPS_FAMILIES):
        pair = [f"{family}_eps0.2", f"{family}_eps0.4"]
        same = [r for r in regimes if any(set(pair) <= set(g) for g in b.runs(r))]
        other = [r for r in regimes if r not in same]
        eps.append(
            f"`{family}` ε 0.2 and ε 0.4"
            + (" are the same run" if i == 0 else "")
            + f" in {len(same)}"
            + (" regimes" if i == 0 else "")
            + (f" (all but {_names(other)})" if other else "")
        )
    out.append(words(eps))
    for r, group in near:
        diff = {
            c: max(
                float(
                    np.nanmax(
                        np.abs(_trial_columns(b.trial_rows, r, group[0], [c]) - _trial_columns(b.trial_rows, r, m, [c]))
                    )
                )
                for m in group[1:]
            )
            for c in ("ess", "kl_grad_share")
        }
        out.append(
            f"In `{r}`, {_names(group)} have the same held-out at every evaluation of every seed, while their ESS "
            f"and KL share differ by up to {diff['ess']:.1e} and {diff['kl_grad_share']:.1e}"
        )
    return out


def regime_sentence_quotes(b: Bench) -> List[str]:
    """The report's sentences, regime by regime."""
    return [line for line in b.report["verdict_sentences"].splitlines() if line.strip()]


def aim_quotes(b: Bench) -> List[str]:
    """P3O's default against the aim: the table, the counts, why the default is what it is, where it misses, and
    what to pick."""
    rows, regimes, stats = b.rows, b.regimes, b.stats
    out: List[str] = []
    aim_rows, held, missed = [], [], []
    for r in regimes:
        top_m = _best(stats[r])
        gap = stats[r][DEFAULT][0] - stats[r][top_m][0]
        word = "best" if top_m == DEFAULT else verdict(stats[r][DEFAULT], stats[r][top_m])
        ok = gap >= -AIM_GAP
        (held if ok else missed).append(r)
        aim_rows.append(
            [
                f"`{r}`",
                pm(*stats[r][DEFAULT]),
                f"`{top_m}` {pm(*stats[r][top_m])}",
                f"{gap:+.3f}",
                "yes" if ok else "**no**",
                word,
            ]
        )
    out += table(
        ["regime", "`p3o_default`", "best method", "gap", f"within {AIM_GAP:g}", "under the tie rule"], aim_rows
    )
    weaker = stats[WEAKER][DEFAULT][0]
    out.append(
        f"P3O's default is within {AIM_GAP:g} of the best method in {len(held)} of {len(regimes)} regimes"
        + (f"; it misses in {_names(missed)}" if missed else "")
    )
    out.append(
        f"the weaker behavior model it ends at {pm(*stats[WEAKER][DEFAULT])} "
        f"({'at or above' if weaker >= AIM_WEAKER else 'below'} the aim of {AIM_WEAKER:g})"
    )
    # Best or tied, counted over the regimes that separate the methods.
    no_difference = [r for r in regimes if all_tie(stats[r])]
    separating = [r for r in regimes if r not in no_difference]
    best_tied = [r for r in separating if DEFAULT in best_or_tied(stats[r])]
    out.append(
        f"best or tied in {len(best_tied)} of {len(separating)}"
        + (
            f" regimes that separate the methods ({_names(no_difference)} show no difference and count for none)"
            if no_difference
            else " regimes"
        )
    )
    out.append(f"best or tied in {len(best_tied)} of {len(separating)} regimes: {_names(best_tied)}")
    # Within the aim's gap but a loss under the tie rule.
    for r in held:
        top_m = _best(stats[r])
        if top_m != DEFAULT and verdict(stats[r][DEFAULT], stats[r][top_m]) == "loses":
            (_, s_d, n_d), (_, s_t, n_t) = stats[r][DEFAULT], stats[r][top_m]
            out.append(
                f"within {AIM_GAP:g} of `{top_m}`, but a loss to it under the tie rule "
                f"({stats[r][DEFAULT][0] - stats[r][top_m][0]:+.3f}, standard error of the difference "
                f"{standard_error(s_d, n_d, s_t, n_t):.3f})"
            )
    by_verdict: Dict[str, List[str]] = {}
    for m in _order(list(stats[WEAKER])):
        if not m.startswith("p3o"):
            by_verdict.setdefault(verdict(stats[WEAKER][DEFAULT], stats[WEAKER][m]), []).append(m)
    verbs = {"wins": "beats", "ties": "ties with", "loses": "loses to"}
    out.append(
        "With the weaker second model it "
        + "; it ".join(f"{verbs[k]} {_names(by_verdict[k])}" for k in ("wins", "ties", "loses") if k in by_verdict)
    )

    # The paper's form and the default, where they differ most.
    for r in (WEAKER, STRONGER):
        out.append(f"`p3o_k3` {pm(*stats[r]['p3o_k3'])} against `p3o_default` {pm(*stats[r][DEFAULT])}")
    for r in (ASYNC,):
        fb = _best({m: v for m, v in stats[r].items() if not m.startswith("p3o")})
        out.append(
            f"`p3o_default` {pm(*stats[r][DEFAULT])}, `p3o_k3` {pm(*stats[r]['p3o_k3'])} and `p3o_k3_is_prox` "
            f"{pm(*stats[r]['p3o_k3_is_prox'])} against `{fb}` {pm(*stats[r][fb])}"
        )
        out.append(f"the batch's mean ESS is {rows[r, DEFAULT]['ess_mean']:.3f}")
        forms = [m for m in stats[r] if m.startswith("p3o")]
        below = all(verdict(stats[r][m], stats[r][fb]) == "loses" for m in forms)
        out.append("every P3O form ends below it" if below else f"not every P3O form ends below `{fb}`")
    fell = rows[WEAKER, "p3o_k3"]
    out.append(
        "where the paper's form of P3O collapses"
        if fell["collapses"] == fell["seeds"]
        else f"where the paper's form of P3O collapses in {fell['collapses']} of {fell['seeds']} seeds"
    )
    r = OFFLINE
    fb = _best({m: v for m, v in stats[r].items() if not m.startswith("p3o")})
    out.append(
        f"`p3o_default` {pm(*stats[r][DEFAULT])} and `p3o_k3` {pm(*stats[r]['p3o_k3'])} against `{fb}`'s "
        f"{pm(*stats[r][fb])}"
    )
    fell_all = [m for m in stats[r] if not m.startswith("p3o") and rows[r, m]["collapses"] == rows[r, m]["seeds"]]
    out.append(f"{_names(fell_all)} collapsed in every seed")
    two = stats[TWO_STEPS]
    fb = _best({m: v for m, v in two.items() if not m.startswith("p3o")})
    p3o_two = {m: v for m, v in two.items() if m.startswith("p3o")}
    out.append(
        f"P3O's forms end at {span([v[0] for v in p3o_two.values()], 3)} (means over seeds) against `{fb}`'s "
        f"{pm(*two[fb])}"
    )
    return out


def diagnostics_quotes(b: Bench) -> List[str]:
    """The KL term's diagnostics: mean ESS, the KL term's share of the gradient and the rejected tokens' share."""
    rows, regimes = b.rows, b.regimes
    diag = []
    for r in regimes:
        for m in DIAGNOSTIC_METHODS:
            row = rows[r, m]
            diag.append(
                [
                    f"`{r}`",
                    f"`{m}`",
                    f"{row['ess_mean']:.3f}",
                    f"{row['kl_grad_share_mean']:.3f}",
                    f"{row['rejected_fraction_mean']:.4f}",
                    pm(row["heldout_at_budget_mean"], row["heldout_at_budget_std"]),
                ]
            )
    out = table(["regime", "method", "mean ESS", "`kl_grad_share`", "`rejected_fraction`", "held-out"], diag)
    # The rejected tokens' share: the largest cell mean (over its trials and iterations) and the largest iteration.
    p3o_cells = {(r, m): row for (r, m), row in rows.items() if m.startswith("p3o")}
    cell_max = max(p3o_cells, key=lambda k: p3o_cells[k]["rejected_fraction_mean"])
    its = b.curves[~b.curves["stage"].str.startswith("lr_") & b.curves["method"].str.startswith("p3o")]
    it_max = its.loc[its["rejected_fraction"].idxmax()]
    cell_from_curves = (
        its[(its["stage"] == cell_max[0]) & (its["method"] == cell_max[1])]
        .groupby("seed")["rejected_fraction"]
        .mean()
        .mean()
    )
    _require(
        math.isclose(cell_from_curves, p3o_cells[cell_max]["rejected_fraction_mean"], rel_tol=1e-9),
        "summary.json's rejected_fraction_mean is the mean of curves.csv's iterations",
    )
    out.append(
        f"The share of tokens with log r < −10 is at most {pct(p3o_cells[cell_max]['rejected_fraction_mean'], 4)} in "
        f"a cell of any regime and P3O form (its mean over trials and iterations; the largest is `{cell_max[1]}` in "
        f"`{cell_max[0]}`), and at most {pct(it_max['rejected_fraction'], 2)} in a single iteration (`{it_max['method']}` "
        f"in `{it_max['stage']}`, seed {int(it_max['seed'])}, iteration {int(it_max['iteration'])})"
    )
    k3w = rows[WEAKER, "p3o_k3"]
    out.append(
        f"the weaker behavior model the KL term is {k3w['kl_grad_share_mean']:.2f} of `p3o_k3`'s gradient "
        f"(`p3o_default`: {rows[WEAKER, DEFAULT]['kl_grad_share_mean']:.2f})"
    )
    return out


def earlier_grid_quotes(b: Bench) -> List[str]:
    """The earlier grid (two steps per batch, P3O's KL as the plain k3 toward π_b), from its own report."""
    old = load_json(b.root, f"{BENCH_TWO_STEP}/summary.json")
    _, _, old_stats = _stats(old)
    ow = old_stats[WEAKER]
    old_best = _best(ow)
    _require(not math.isnan(ow["p3o"][0]), "the earlier grid has P3O with the weaker behavior model")
    return [f"P3O ended at {pm(*ow['p3o'])} with the weaker behavior model, against `{old_best}`'s {pm(*ow[old_best])}"]


# In page order. The staleness sections (results/bench-development, results/bench-confirmation) go before the
# earlier grid, where the page has its `<!-- staleness sections -->` mark.
SECTIONS: List[Callable[[Bench], List[str]]] = [
    setup_quotes,
    lr_quotes,
    results_quotes,
    same_run_quotes,
    regime_sentence_quotes,
    aim_quotes,
    diagnostics_quotes,
    earlier_grid_quotes,
]


def quotes(root: str, sections: Optional[Sequence[Callable[[Bench], List[str]]]] = None) -> List[str]:
    bench = load(root)
    return [q for section in (SECTIONS if sections is None else sections) for q in section(bench)]


PAGE = Page(
    path="docs/results/claims.md",
    quotes=quotes,
    settings=(
        "4 to 7 digits",
        "`sort:7,3,9,1,4=` → `1,3,4,7,9`",
        "7 to 13 tokens plus EOS (mean about 10)",
        "2-layer tiny Qwen2 pretrained locally for 1,500 steps",
        "right in only 20% of the format lines",
        "4 samples at T = 1 for each of 200 held-out lists, every 5 iterations",
        "the 800 samples are independent and the estimate's standard error is at most 0.018",
        "at most 16 new tokens",
        "one optimizer step per iteration (minibatch = batch = 512 completions)",
        "the lr warmed up from 1e-5 to its peak over the first 10 iterations",
        "iterations 1, 5, 10, ..., 30, so the last figure is the policy after 29 updates",
        "peak lr 1.25e-4, 2.5e-4 and 5e-4 × 2 seeds",
        "× 3 seeds",
        "within 0.05 of the best method in every regime",
        "≥ 0.75 with the weaker behavior model",
        "T = 1.2",
        "4 of each group's 8 completions",
        "pretraining stopped at 500 steps",
        "RL-trained (P3O) to held-out 0.7",
        "up to 4 weight versions old",
        "30 iterations of trajectories",
        "two optimizer steps per rollout batch (minibatches of 256 of 512)",
        "0.1 below",
        "\\|log r\\| > 10",
        "log r < −10",
        "at most 1/e",
        "every ratio is 1",
        "reward 1 if the completion starts",
        "(avg@4)",
        "min(π_old/π_rollout, 2)",
        "[0.999, 1.001]",
        "seeds 0 and 1",
        "(iteration 30)",
        "over 3 seeds per cell",
        "in every regime over 3 seeds",
        "up to 4 versions old",
        "r → 0",
        "exit status 130",
    ),
)
