"""The claims sweep's outputs: every trial's curve as rows (``curves.csv``), the summary table and one figure per
regime. Held-out accuracy is measured at the start of an iteration, so its x-value is the completions trained
before it: ``(training_iteration - 1) × completions per iteration``.

Per regime and method, over seeds:
- held-out at the budget: the last evaluation of each trial (mean ± std);
- samples to target: the first evaluation at or above the target (median over the seeds that reach it, and how
  many do);
- collapses: trials that errored, or whose last held-out is more than `COLLAPSE_DROP` below their first (the demo's
  sweep) or below their best (the claims bench, `Grid.collapse_from`: a rise and a later fall is the paper's
  collapse).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from rllib_p3o.core import metrics
from rllib_p3o.sweep import failures, verdicts
from rllib_p3o.sweep.machine import cpu_description

CURVES_CSV = "curves.csv"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
FIGURES = "figures"
COLLAPSE_DROP = verdicts.COLLAPSE_DROP
# Columns of curves.csv.
STAGE, METHOD, SEED, LR_PEAK, ITERATION, SAMPLES = "stage", "method", "seed", "lr_peak", "iteration", "samples"
HELDOUT, ESS, REWARD, SETUP_S, ACTOR_REUSED, ERROR = ("heldout", "ess", "reward", "setup_s", "actor_reused", "error")
# The learner's diagnostics of the KL term (P3O's losses; NaN for the others).
KL_WEIGHT, KL_GRAD_SHARE, REJECTED = "kl_weight", "kl_grad_share", "rejected_fraction"
# What bounded the update at each iteration (NaN where the loss has no such part): the largest ratio πθ/π_b, the
# shares of tokens capped (P3O), clipped (GRPO and the π_old-clipped losses), masked by a trust region (P3O's, M2PO's,
# decoupled PPO's), the KL term's value, and ESS per source and policy version (JSON: {"source/<name>": ess, ...,
# "policy/<staleness>": ess}).
RATIO_MAX, CAP_FRACTION, CLIP_FRACTION = "ratio_max", "cap_fraction", "clip_fraction"
MASKED_FRACTION, KL_VALUE, ESS_GROUPS = "masked_fraction", "kl_value", "ess_groups"
# How stale the policy's samples were (async regimes: versions behind the learner; 0 in sync ones).
STALENESS_MEAN, STALENESS_MAX = "staleness_mean", "staleness_max"
# A method that shares another's trial in a regime (`rllib_p3o.sweep.grid.Grid.same_run_as`): that method's name.
SAME_RUN_AS = "same_run_as"
TIME_S = "time_total_s"  # the trial's wall time so far (Tune's), so a resumed sweep's files still add up to its cost
# The CPU the trial ran on (`rllib_p3o.sweep.machine.cpu_description`): a set resumed on another machine says so.
MACHINE = "machine"
PER_ITERATION = "completions_per_iteration"
# The lr stage of a regime is the stage "lr_<regime>" (the demo sweep's single lr stage is "lr").
LR_STAGE_PREFIX = "lr_"
# Result paths of the per-iteration columns.
_SOURCES = {
    HELDOUT: (metrics.P3O, metrics.HELDOUT_REWARD_MEAN),
    ESS: (*metrics.LEARNER, metrics.ESS),
    REWARD: (metrics.P3O, metrics.REWARD_MEAN),
    SETUP_S: (metrics.P3O, metrics.SETUP_S),
    ACTOR_REUSED: (metrics.P3O, metrics.ACTOR_REUSED),
    KL_WEIGHT: (*metrics.LEARNER, metrics.KL_WEIGHT),
    KL_GRAD_SHARE: (*metrics.LEARNER, metrics.KL_GRAD_SHARE),
    REJECTED: (*metrics.LEARNER, metrics.REJECTED_FRACTION),
    RATIO_MAX: (*metrics.LEARNER, metrics.RATIO_MAX),
    CAP_FRACTION: (*metrics.LEARNER, metrics.CAP_FRACTION),
    CLIP_FRACTION: (*metrics.LEARNER, metrics.CLIP_FRACTION),
    KL_VALUE: (*metrics.LEARNER, metrics.KL_BEHAVIOR),
    STALENESS_MEAN: (metrics.P3O, metrics.STALENESS_MEAN),
    STALENESS_MAX: (metrics.P3O, metrics.STALENESS_MAX),
}
# A loss reports at most one of these masks; the trial file's masked_fraction is the one it reports.
_MASKS = (
    metrics.TRUST_MASKED_FRACTION,
    metrics.M2_MASKED_FRACTION,
    metrics.BEHAVIOR_MASKED_FRACTION,
    metrics.SEQ_MASKED_FRACTION,
)
TRIALS_DIR = "trials"


def result_row(result: Dict[str, Any]) -> Dict[str, Any]:
    """One iteration of a trial as a row of curves.csv (without the trial's identity): NaN where not reported."""
    row = {ITERATION: int(result.get("training_iteration", 0)), TIME_S: float(result.get(TIME_S, math.nan))}
    for key, path in _SOURCES.items():
        value = metrics.lookup(result, *path)
        try:
            row[key] = float(value)
        except (TypeError, ValueError):  # not reported this iteration (held-out: only every eval_interval)
            row[key] = math.nan
    learner = metrics.lookup(result, *metrics.LEARNER) or {}
    masks = [float(learner[k]) for k in _MASKS if isinstance(learner.get(k), (int, float))]
    row[MASKED_FRACTION] = masks[0] if masks else math.nan
    row[ESS_GROUPS] = json.dumps(_ess_groups(result, learner), sort_keys=True)
    return row


def _ess_groups(result: Mapping[str, Any], learner: Mapping[str, Any]) -> Dict[str, float]:
    """ESS per source (``p3o/by_source/<name>/ess``) and per policy version (the learner's ``by_staleness/<k>/ess``:
    the policy's rows that many versions behind), rounded to 6 digits."""
    groups: Dict[str, float] = {}
    for label, node in (("source", (metrics.lookup(result, metrics.P3O, metrics.BY_SOURCE) or {})),
                        ("policy", learner.get(metrics.BY_STALENESS) or {})):  # fmt: skip
        for name, stats in node.items():
            value = stats.get(metrics.ESS) if isinstance(stats, Mapping) else None
            if isinstance(value, (int, float)) and not math.isnan(value):  # NaN: the group was not in this batch
                groups[f"{label}/{name}"] = round(float(value), 6)
    return groups


def trial_path(out: str, stage: str, name: str) -> str:
    return os.path.join(out, TRIALS_DIR, stage, f"{name}.csv")


def write_trial(
    path: str, stage: str, cell: tuple, rows: Sequence[Dict[str, Any]], error: bool, samples_per_iteration: int
) -> None:
    """A finished (or errored) trial's rows, written once it ends: a rerun of the sweep skips its cell. An errored
    trial keeps its rows (one empty row when it has none)."""
    method, seed, lr = cell
    df = pd.DataFrame(list(rows) or [{ITERATION: 0}])
    df[SAMPLES] = (df[ITERATION] - 1).clip(lower=0) * samples_per_iteration
    for key, value in (
        (STAGE, stage),
        (METHOD, method),
        (SEED, seed),
        (LR_PEAK, lr),
        (ERROR, error),
        (PER_ITERATION, samples_per_iteration),
        (MACHINE, cpu_description()),
    ):
        df[key] = value
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)  # a kill mid-write leaves no half file that would count as finished


def read_trials(out: str, stage: Optional[str] = None) -> pd.DataFrame:
    """Every finished trial's rows under ``out`` (of one ``stage``, or all)."""
    root = os.path.join(out, TRIALS_DIR)
    stages = [stage] if stage else sorted(os.listdir(root)) if os.path.isdir(root) else []
    frames = []
    for st in stages:
        folder = os.path.join(root, st)
        if os.path.isdir(folder):
            frames += [pd.read_csv(os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f.endswith(".csv")]
    return concat(frames)


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


COLLAPSE_FROM = ("first", "best")


def per_trial(curves: pd.DataFrame, target: float, collapse_from: str = "first") -> pd.DataFrame:
    """One row per trial: first, best and last held-out, samples to ``target`` (NaN: not reached), collapse (the last
    held-out more than `COLLAPSE_DROP` below the ``collapse_from`` one, or an error), ESS mean."""
    if collapse_from not in COLLAPSE_FROM:
        raise ValueError(f"collapse_from must be one of {COLLAPSE_FROM}, got {collapse_from!r}")
    out = []
    for (stage, method, seed, lr), t in curves.groupby([STAGE, METHOD, SEED, LR_PEAK], sort=False, dropna=False):
        ev = t.dropna(subset=[HELDOUT]).sort_values(ITERATION)
        first = float(ev[HELDOUT].iloc[0]) if len(ev) else math.nan
        last = float(ev[HELDOUT].iloc[-1]) if len(ev) else math.nan
        best = float(ev[HELDOUT].max()) if len(ev) else math.nan
        reference = best if collapse_from == "best" else first
        hit = ev[ev[HELDOUT] >= target]
        errored = bool(t[ERROR].any())
        out.append(
            {
                STAGE: stage,
                METHOD: method,
                SEED: seed,
                LR_PEAK: lr,
                "heldout_first": first,
                "heldout_last": last,
                "heldout_best": best,
                "samples_at_last_eval": float(ev[SAMPLES].iloc[-1]) if len(ev) else math.nan,
                "samples_to_target": float(hit[SAMPLES].iloc[0]) if len(hit) else math.nan,
                "collapsed": errored or not len(ev) or last < reference - COLLAPSE_DROP,
                ERROR: errored,
                "ess_mean": float(t[ESS].mean()),
                **{f"{key}_mean": _column_mean(t, key) for key in (KL_GRAD_SHARE, REJECTED)},
                TIME_S: float(t[TIME_S].max()) if TIME_S in t else math.nan,
                SETUP_S: float(t[SETUP_S].dropna().iloc[0]) if t[SETUP_S].notna().any() else math.nan,
                ACTOR_REUSED: bool(t[ACTOR_REUSED].fillna(0).max() > 0),
                SAME_RUN_AS: t[SAME_RUN_AS].dropna().iloc[0]
                if SAME_RUN_AS in t and t[SAME_RUN_AS].notna().any()
                else None,
            }
        )
    return pd.DataFrame(out)


def _column_mean(rows: pd.DataFrame, key: str) -> float:
    """The mean of a per-iteration column over a trial's rows; NaN where the trial's file has no such column (files
    written before it existed, or a loss that does not report it)."""
    return float(rows[key].mean()) if key in rows else math.nan


def summarize(trials: pd.DataFrame) -> pd.DataFrame:
    """Per stage and method over seeds: held-out at the budget (mean, std, n), samples to target, collapses."""
    rows = []
    for (stage, method), t in trials.groupby([STAGE, METHOD], sort=False):
        reached = t["samples_to_target"].dropna()
        rows.append(
            {
                STAGE: stage,
                METHOD: method,
                "seeds": len(t),
                "heldout_at_budget_mean": float(t["heldout_last"].mean()),
                "heldout_at_budget_std": float(t["heldout_last"].std(ddof=1)) if len(t) > 1 else 0.0,
                "heldout_start_mean": float(t["heldout_first"].mean()),
                "reached_target": int(len(reached)),
                "samples_to_target_median": float(reached.median()) if len(reached) else math.nan,
                "collapses": int(t["collapsed"].sum()),
                "errors": int(t[ERROR].sum()),
                "ess_mean": float(t["ess_mean"].mean()),
                **{f"{key}_mean": float(t[f"{key}_mean"].mean()) for key in (KL_GRAD_SHARE, REJECTED)},
                "budget_samples": float(t["samples_at_last_eval"].max()),
            }
        )
    return pd.DataFrame(rows)


def choose_lr(curves: pd.DataFrame, peaks: Sequence[float], target: float = 0.8) -> Dict[str, Any]:
    """The peak lr whose worse method (mean last held-out over seeds) is best: fair to both losses."""
    trials = per_trial(curves, target)
    scores = {
        float(p): {
            m: float(t["heldout_last"].mean()) for m, t in trials[np.isclose(trials[LR_PEAK], p)].groupby(METHOD)
        }
        for p in peaks
    }
    best = max(scores, key=lambda p: (min(scores[p].values()) if scores[p] else -1.0, -p))
    return {
        "lr_peak": best,
        "scores": {f"{p:g}": s for p, s in scores.items()},
        "why": "mean held-out at the budget of the worse method, per peak: "
        + ", ".join(f"{p:g} → {min(s.values()):.3f}" for p, s in scores.items() if s),
    }


def choose_lr_per_method(curves: pd.DataFrame, peaks: Sequence[float], target: float) -> Dict[str, Any]:
    """Each method's best peak lr: the highest mean held-out at the budget over the lr stage's regimes and seeds
    (ties: the smaller peak). Also each method's best and worst cell, for the "no tuning" table."""
    trials = per_trial(curves, target)
    choice: Dict[str, Any] = {"lr_peak": {}, "scores": {}}
    for method, t in trials.groupby(METHOD, sort=False):
        scores = {float(p): float(t[np.isclose(t[LR_PEAK], p)]["heldout_last"].mean()) for p in peaks}
        scores = {p: v for p, v in scores.items() if not math.isnan(v)}
        if scores:
            choice["lr_peak"][method] = max(scores, key=lambda p: (scores[p], -p))
            choice["scores"][method] = {f"{p:g}": v for p, v in scores.items()}
    choice["why"] = (
        "per method, the peak with the best mean held-out at the budget over the lr stage's regimes and seeds"
    )
    return choice


def lr_spread_table(curves: pd.DataFrame, target: float) -> str:
    """Per method over the lr stage's cells (regime × peak, mean over seeds): best, worst, and the spread. A family of
    methods that differ only in a clip range (``grpo_tis_eps0.2``, ``grpo_tis_eps0.4``) gets a row of its own over
    regime × peak × ε: what tuning ε on top of the lr is worth, beside P3O's spread over the lr alone."""
    trials = per_trial(curves, target)
    lines = [
        "| method | best cell (regime, peak lr) | worst cell | spread (best − worst) | per peak, mean over regimes |",
        "|---|---|---|---|---|",
    ]
    families: Dict[str, pd.DataFrame] = {}
    for method, t in trials.groupby(METHOD, sort=False):
        lines += _spread_row(method, t, [STAGE, LR_PEAK])
        family = method.split(EPS_SUFFIX)[0]
        families[family] = pd.concat([families[family], t]) if family in families else t
    for family, t in families.items():
        if t[METHOD].nunique() > 1:
            lines += _spread_row(f"{family} (over ε too)", t, [STAGE, LR_PEAK, METHOD])
    return "\n".join(lines) + "\n"


EPS_SUFFIX = "_eps"  # a method name's clip-range suffix (`rllib_p3o.sweep.grid.METHODS`)


def _spread_row(label: str, trials: pd.DataFrame, cell: List[str]) -> List[str]:
    """One row of `lr_spread_table`: the best and worst of ``trials``' cells (mean held-out at the budget over seeds)."""
    cells = trials.groupby(cell)["heldout_last"].mean()
    if cells.empty:
        return []

    def where(key: tuple) -> str:
        regime, peak, *method = key
        eps = [f"ε {m.split(EPS_SUFFIX)[1]}" for m in method if EPS_SUFFIX in m]
        return ", ".join([_regime_of(regime), f"{peak:g}", *eps])

    per_peak = trials.groupby(LR_PEAK)["heldout_last"].mean()
    return [
        f"| {label} | {cells.max():.3f} ({where(cells.idxmax())}) | {cells.min():.3f} ({where(cells.idxmin())}) "
        f"| {cells.max() - cells.min():.3f} | " + ", ".join(f"{p:g}: {v:.3f}" for p, v in per_peak.items()) + " |"
    ]


def _regime_of(stage: str) -> str:
    return stage[len(LR_STAGE_PREFIX) :] if stage.startswith(LR_STAGE_PREFIX) else stage


def _fmt_samples(x: float) -> str:
    return "–" if math.isnan(x) else f"{x / 1000:.1f}k"


def markdown_table(summary: pd.DataFrame, target: float) -> str:
    lines = [
        f"| regime | method | held-out at budget (mean ± std, n) | reached {target:g} | samples to {target:g} "
        "(median) | collapses | mean ESS |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        lines.append(
            f"| {r[STAGE]} | {r[METHOD]} | {r['heldout_at_budget_mean']:.3f} ± "
            f"{r['heldout_at_budget_std']:.3f} (n={r['seeds']}) | {r['reached_target']}/{r['seeds']} | "
            f"{_fmt_samples(r['samples_to_target_median'])} | {r['collapses']} | {r['ess_mean']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def best_methods(rows: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """The methods of one regime's summary rows (method -> row) that are best or tied for best
    (`rllib_p3o.sweep.verdicts.TIE_RULE`, on held-out at the budget over seeds)."""
    return verdicts.best_or_tied({m: _stats(r) for m, r in rows.items()})


def _stats(row: Mapping[str, Any]) -> Tuple[float, float, int]:
    """A summary row's held-out at the budget as `rllib_p3o.sweep.verdicts` reads it: (mean, std, seeds)."""
    return (float(row["heldout_at_budget_mean"]), float(row["heldout_at_budget_std"]), int(row["seeds"]))


def matrix_cell(row: Mapping[str, Any], bold: bool) -> str:
    """One summary row as a matrix cell: held-out at the budget, mean ± std over seeds, in bold when the method is
    best or tied for best in its regime (`best_methods`), the collapses counted after it."""
    text = f"{row['heldout_at_budget_mean']:.3f} ± {row['heldout_at_budget_std']:.3f}"
    if bold:
        text = f"**{text}**"
    if row["collapses"]:
        text += f" ({int(row['collapses'])}/{int(row['seeds'])} collapsed)"
    return text


def regime_matrix(summary: pd.DataFrame) -> str:
    """The summary as one row per regime and one column per method: held-out at the budget (mean ± std over seeds),
    the collapses counted after it, the regime's best and those tied with it in bold (`best_methods`)."""
    if not len(summary):
        return ""
    regimes = list(dict.fromkeys(summary[STAGE]))
    methods = list(dict.fromkeys(summary[METHOD]))
    cells = summary.set_index([STAGE, METHOD])
    lines = ["| regime | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for regime in regimes:
        rows = {m: cells.loc[(regime, m)] for m in methods if (regime, m) in cells.index}
        best = set(best_methods(rows))
        row = [matrix_cell(rows[m], m in best) if m in rows else "–" for m in methods]
        lines.append(f"| {regime} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# Methods whose verdicts the report writes out: P3O and its variants (every method's bold is in the matrix). Each is
# measured against the best method outside this family (a baseline), not against another P3O variant.
FOCUS_PREFIX = "p3o"


def regime_verdicts(summary: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per regime, under `rllib_p3o.sweep.verdicts.TIE_RULE` on held-out at the budget: the methods best or tied for
    best; each P3O method's verdict against the best baseline (the highest mean among the methods outside P3O's
    family: ``wins``, ``ties``, ``loses``) with the gap of the means; and the collapses of every method that had one."""
    out: List[Dict[str, Any]] = []
    if not len(summary):
        return out
    for regime, rows in summary.groupby(STAGE, sort=False):
        by_method = {r[METHOD]: r for r in rows.to_dict(orient="records")}
        stats = {m: _stats(r) for m, r in by_method.items()}
        focus = {}
        for method in (m for m in by_method if m.startswith(FOCUS_PREFIX)):
            others = {m: v for m, v in stats.items() if not m.startswith(FOCUS_PREFIX) and not math.isnan(v[0])}
            if not others or math.isnan(stats[method][0]):
                continue
            rival = max(others, key=lambda m: others[m][0])
            focus[method] = {
                "verdict": verdicts.verdict(stats[method], others[rival]),
                "against": rival,
                "gap": stats[method][0] - others[rival][0],
            }
        out.append(
            {
                "regime": regime,
                "best_or_tied": best_methods(by_method),
                "all_tie": verdicts.all_tie(stats),
                "focus": focus,
                "collapses": {m: f"{r['collapses']}/{r['seeds']}" for m, r in by_method.items() if r["collapses"]},
            }
        )
    return out


def verdict_sentences(rows: Sequence[Mapping[str, Any]], summary: pd.DataFrame) -> str:
    """`regime_verdicts` as one markdown bullet per regime (the words every results page quotes)."""
    cells = {(r[STAGE], r[METHOD]): r for r in summary.to_dict(orient="records")}

    def held(regime: str, method: str) -> str:
        r = cells[regime, method]
        return f"`{method}` {r['heldout_at_budget_mean']:.3f} ± {r['heldout_at_budget_std']:.3f}"

    lines = []
    for v in rows:
        regime = v["regime"]
        if v.get("all_tie"):
            text = (
                f"- **{regime}**: every method is best or tied (no evidence for any): "
                + ", ".join(held(regime, m) for m in v["best_or_tied"])
                + "."
            )
        else:
            text = f"- **{regime}**: best or tied: " + ", ".join(held(regime, m) for m in v["best_or_tied"]) + "."
        for method, f in v["focus"].items():
            word = {"wins": "wins over", "ties": "ties with", "loses": "loses to"}[f["verdict"]]
            fell = v["collapses"].get(method)  # a wide spread can tie: say beside it when seeds collapsed
            text += f" `{method}` {word} `{f['against']}` ({f['gap']:+.3f}{f'; {fell} collapsed' if fell else ''})."
        if v["collapses"]:
            text += " Collapses: " + ", ".join(f"`{m}` {c}" for m, c in v["collapses"].items()) + "."
        lines.append(text)
    return "\n".join(lines) + "\n" if lines else ""


def plot_regime(
    curves: pd.DataFrame,
    regime: str,
    path: str,
    samples_per_iteration: Optional[int] = None,
    heldout_label: str = "held-out accuracy (greedy)",
    highlight: Sequence[str] = (),
) -> str:
    """Held-out accuracy and ESS against samples, mean ± std over seeds, one line per method (``highlight``: thick and
    black, e.g. the default); the legend beside the panels, one colour and dash per method up to 20 methods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(curves.loc[curves[STAGE] == regime, METHOD]))
    colors = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20").colors
    dashes = ("-", "--", "-.", ":")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for i, (method, t) in enumerate(curves[curves[STAGE] == regime].groupby(METHOD, sort=False)):
        style = dict(
            color="black" if method in highlight else colors[i % len(colors)],
            linestyle=dashes[(i // len(colors)) % len(dashes)] if method not in highlight else "-",
            linewidth=2.6 if method in highlight else 1.2,
            zorder=3 if method in highlight else 2,
        )
        for ax, col, shift in ((axes[0], HELDOUT, 0), (axes[1], ESS, 1)):
            d = t.dropna(subset=[col])
            if d.empty:
                continue
            # ESS belongs to the batch trained in the iteration: x = completions trained after it.
            x = d[SAMPLES] + shift * (samples_per_iteration or 0)
            g = d.assign(x=x).groupby("x")[col]
            mean, std = g.mean(), g.std(ddof=1).fillna(0.0)
            ax.plot(mean.index, mean.values, label=method if ax is axes[0] else None, **style)
            ax.fill_between(mean.index, (mean - std).values, (mean + std).values, alpha=0.12, color=style["color"])
    for ax, label in zip(axes, (heldout_label, "ESS of the training batch")):
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("completions trained")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{regime}: mean ± std over seeds")
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    fig.legend(loc="center left", bbox_to_anchor=(0.835, 0.5), fontsize=8, frameon=False)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(
    out: str,
    curves: pd.DataFrame,
    grid,
    *,
    lr_peak: Union[None, float, Dict[str, float]],
    wall_s: Optional[float],
    note: Optional[str] = None,
) -> Dict:
    """summary.md, summary.json and figures/<regime>.png under ``out``; returns what was written (and the facts).
    ``lr_peak``: one peak for every method, or each method's (None: not chosen yet). ``note`` opens summary.md (a
    partial report says what is missing)."""
    from rllib_p3o.sweep.grid import DEFAULT_METHOD, TASKS

    curves = _in_grid_order(curves, grid)
    regimes = [r for r in grid.regimes if r in set(curves[STAGE])]
    regime_curves = curves[curves[STAGE].isin(regimes)]
    all_trials = per_trial(curves, grid.target, grid.collapse_from)  # the lr stages' trials too, for the cost
    trials = all_trials[all_trials[STAGE].isin(regimes)].reset_index(drop=True)
    summary = summarize(trials)
    rows_per_it = _rows_per_iteration(curves)
    os.makedirs(os.path.join(out, FIGURES), exist_ok=True)
    label = TASKS[grid.task].heldout_label
    figures = [
        plot_regime(regime_curves, r, os.path.join(out, FIGURES, f"{r}.png"), rows_per_it, label, (DEFAULT_METHOD,))
        for r in regimes
    ]
    lr_curves = curves[curves[STAGE].str.startswith(LR_STAGE_PREFIX)] if len(curves) else curves
    lr_table = lr_spread_table(lr_curves, grid.target) if len(lr_curves) else ""
    if lr_peak is None:
        lr_text = "Peak lr: not chosen yet (the lr stage has not finished)"
    elif isinstance(lr_peak, dict):
        lr_text = "Peak lr per method (its best in the lr stage): " + ", ".join(
            f"{m} {p:g}" for m, p in lr_peak.items()
        )
    else:
        lr_text = f"Peak lr {lr_peak:g} for every method"
    own = _unique_runs(trials)
    fresh, reused = (own[own[ACTOR_REUSED] == flag][SETUP_S].dropna() for flag in (False, True))
    startup = {
        "fresh_actor_setup_s_mean": float(fresh.mean()) if len(fresh) else None,
        "fresh_trials": len(fresh),
        "reused_actor_setup_s_mean": float(reused.mean()) if len(reused) else None,
        "reused_trials": len(reused),
    }
    infra = failures.recorded(out)
    runs = _unique_runs(all_trials)
    timed = runs[TIME_S].dropna()
    cost = {"trial_time_s_sum": float(timed.sum()), "timed_trials": len(timed), "trials": len(runs)}
    table = markdown_table(summary, grid.target)
    matrix = regime_matrix(summary)
    regime_words = regime_verdicts(summary)
    sentences = verdict_sentences(regime_words, summary)
    md = os.path.join(out, SUMMARY_MD)
    with open(md, "w") as f:
        f.write(
            (f"{note}\n\n" if note else "") + f"{lr_text}; {grid.iterations} iterations of {rows_per_it} completions "
            f"per trial; target held-out {grid.target:g}; collapse: errored or last held-out more than "
            f"{COLLAPSE_DROP:g} below the {grid.collapse_from}.\n\n{table}\n"
            + (
                f"Held-out at the budget per regime and method (mean ± std over seeds; best in bold):\n\n{matrix}\n"
                if matrix
                else ""
            )
            + (f"Verdicts ({verdicts.TIE_RULE}):\n\n{sentences}\n" if sentences else "")
            + (f"The lr stage (held-out at the budget, mean over seeds):\n\n{lr_table}\n" if lr_table else "")
            + "Start-up per trial: fresh actor "
            f"{_s(startup['fresh_actor_setup_s_mean'])} (n={len(fresh)}), reused actor "
            f"{_s(startup['reused_actor_setup_s_mean'])} (n={len(reused)}).\n"
            f"Trials' wall time: {cost['trial_time_s_sum'] / 3600:.2f} h over {cost['timed_trials']} of "
            f"{cost['trials']} trials"
            + (" (the others' files have no time column)" if cost["timed_trials"] < cost["trials"] else "")
            + ".\n"
            + (
                f"Infrastructure failures (an actor or node lost; retried, never counted as collapses): "
                f"{len(infra)}, listed in {failures.INFRA_FAILURES}.\n"
                if infra
                else ""
            )
        )
    facts = {
        "note": note,
        "lr_peak": lr_peak,
        "iterations": grid.iterations,
        "target": grid.target,
        "completions_per_iteration": rows_per_it,
        "wall_s": wall_s,
        "startup": startup,
        "cost": cost,
        "infrastructure_failures": len(infra),
        "table": md,
        "lr_table": lr_table,
        "matrix": matrix,
        "tie_rule": verdicts.TIE_RULE,
        "verdicts": regime_words,
        "verdict_sentences": sentences,
        "figures": figures,
        "summary": summary.to_dict(orient="records"),
        "trials": trials.to_dict(orient="records"),
    }
    # The file names its outputs relative to ``out``, so that a copied or committed report stays true.
    relative = {"table": os.path.relpath(md, out), "figures": [os.path.relpath(p, out) for p in figures]}
    with open(os.path.join(out, SUMMARY_JSON), "w") as f:
        json.dump({**facts, **relative}, f, indent=2, default=float)
    return facts


def _in_grid_order(curves: pd.DataFrame, grid) -> pd.DataFrame:
    """``curves`` sorted by stage (the lr stages first) and method as the grid lists them, so that tables and legends
    follow the grid whatever order the trial files were read in."""
    stages = [LR_STAGE_PREFIX + r for r in grid.lr_regimes] + list(grid.regimes)
    rank = {STAGE: {s: i for i, s in enumerate(stages)}, METHOD: {m: i for i, m in enumerate(grid.all_methods())}}
    return curves.sort_values([STAGE, METHOD], key=lambda col: col.map(rank[col.name]), kind="stable")


def _unique_runs(trials: pd.DataFrame) -> pd.DataFrame:
    """``trials`` with each run once: a regime stage's seeds taken from its lr stage are the same runs, and a method
    that shares another's trial (`SAME_RUN_AS`) adds no run of its own."""
    if not len(trials):
        return trials
    if SAME_RUN_AS in trials:
        trials = trials[trials[SAME_RUN_AS].isna()]
    regime = trials[STAGE].map(_regime_of).rename("_regime")
    return trials.loc[~pd.concat([regime, trials[[METHOD, SEED, LR_PEAK]]], axis=1).duplicated()]


def _rows_per_iteration(curves: pd.DataFrame) -> int:
    return int(curves[PER_ITERATION].max()) if len(curves) else 0


def _s(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1f} s"
