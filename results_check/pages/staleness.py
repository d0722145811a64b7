"""docs/results/staleness.md: P3O under staleness, from the claims bench's development set (`results/bench-development`:
`summary.json`, `curves.csv`, `lr_choice.json`) and its confirmation set (`results/bench-confirmation/summary.json`,
a partial report while the set is still running). The candidates' settings come from the sweep's method table; the
choice, the verdicts and the aim follow `rllib_p3o.sweep.verdicts`.

While the confirmation set runs, its report is committed as it grows (``rllib-p3o sweep ... --confirmation
--report-only``, then its ``summary.json``, ``summary.md`` and ``trials/`` copied to ``results/bench-confirmation/``);
``python -m results_check.pages.staleness`` then rewrites the page's confirmation section and summary sentence from
those files (`write_page`), and the check holds the page to them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
from typing import Dict, List, Mapping, Optional, Tuple

import pandas as pd
import torch

from results_check.page import Page
from results_check.pages._fmt import load_json, pm, table, words
from results_check.pages._paths import BENCH_CONFIRMATION, BENCH_DEVELOPMENT
from rllib_p3o.core.losses.trust_region import ess_band
from rllib_p3o.sweep import report
from rllib_p3o.sweep.grid import DEFAULT_CANDIDATES, GRIDS, METHODS, REGIMES, STALENESS_DEFAULT, canonical_method
from rllib_p3o.sweep.grid import Grid as SweepGrid
from rllib_p3o.sweep.verdicts import (
    CHOICE_RULE,
    COLLAPSE_RULE,
    TIE_RULE,
    all_tie,
    best_or_tied,
    choose_default,
    verdict,
)

REFERENCE = "p3o_reference"  # the paper's reference implementation (FeynRL), one setting away from the default
BEFORE = "p3o_source"  # P3O's default before the choice (0.2)
# The peers' own answers at their shipped settings: GRPO's clip at ε 0.2 (against π_b, as PPO), verl's TIS, TRL's
# sequence mask, MiniMax's CISPO, FeynRL's P4O, M2PO and AReaL's decoupled PPO.
PEER_DEFAULTS = (
    "grpo_eps0.2",
    "grpo_tis_eps0.2",
    "grpo_seq_mask_eps0.2",
    "cispo",
    "p3o_proximal",
    "m2po",
    "decoupled_ppo",
)
# The learner's per-iteration diagnostics the page averages (trial files' columns), with the page's names.
DIAGNOSTICS = (
    ("ess", "mean ESS"),
    ("cap_fraction", "tokens capped at ESS"),
    ("masked_fraction", "tokens the trust region stops"),
    ("ratio_max", "largest ratio"),
    ("kl_grad_share", "KL share of the gradient"),
)

Stats = Dict[str, Dict[str, Tuple[float, float, int]]]


@dataclasses.dataclass(frozen=True)
class Grid:
    """One set's committed report: its rows per (regime, method), statistics, collapses and the partial note."""

    folder: str
    report: Mapping
    rows: Dict[Tuple[str, str], Mapping]
    regimes: List[str]
    methods: List[str]
    stats: Stats
    collapses: Dict[str, Dict[str, int]]
    curves: Optional[pd.DataFrame]  # every iteration of every finished trial (curves.csv, or a partial set's trials)

    @property
    def note(self) -> Optional[str]:
        return self.report.get("note")


def load(root: str, folder: str, grid: Optional[SweepGrid] = None) -> Optional[Grid]:
    """A set's files, None when it has none committed; stages without rows of the regime stage (the lr stage) are
    left out. A partial set has no curves.csv yet: its curves are read from its trial files, where ``grid`` (the
    set's sweep grid) says which method shares which one's trials."""
    if not os.path.exists(os.path.join(root, folder, "summary.json")):
        return None
    report = load_json(root, f"{folder}/summary.json")
    rows = {(r["stage"], r["method"]): r for r in report["summary"] if not r["stage"].startswith("lr_")}
    regimes = list(dict.fromkeys(s for s, _ in rows))
    methods = list(dict.fromkeys(m for _, m in rows))
    stats: Stats = {r: {} for r in regimes}
    collapses: Dict[str, Dict[str, int]] = {r: {} for r in regimes}
    for (s, m), row in rows.items():
        stats[s][m] = (row["heldout_at_budget_mean"], row["heldout_at_budget_std"], int(row["seeds"]))
        collapses[s][m] = int(row["collapses"])
    curves_path = os.path.join(root, folder, "curves.csv")
    if os.path.exists(curves_path):
        curves = pd.read_csv(curves_path)
    else:
        curves = _curves_from_trials(os.path.join(root, folder), list(rows), grid) if grid is not None else None
    return Grid(folder, report, rows, regimes, methods, stats, collapses, curves)


def _curves_from_trials(out: str, cells: List[Tuple[str, str]], grid: SweepGrid) -> Optional[pd.DataFrame]:
    """Every finished trial's rows under ``out``, and for a (regime, method) that shares another method's trials
    (`Grid.same_run_as`) those rows under its own name, as the sweep's curves.csv holds them."""
    trials = report.read_trials(out)
    if not len(trials):
        return None
    frames = [trials]
    for regime, method in cells:
        twin = grid.same_run_as(regime, method)
        if twin != method:
            rows = trials[(trials[report.STAGE] == regime) & (trials[report.METHOD] == twin)]
            frames.append(rows.assign(**{report.METHOD: method, report.SAME_RUN_AS: twin}))
    return report.concat(frames)


def _cell(g: Grid, regime: str, method: str, bold: bool) -> str:
    if method not in g.stats[regime]:
        return "–"
    mean, std, n = g.stats[regime][method]
    text = f"**{pm(mean, std)}**" if bold else pm(mean, std)
    if g.collapses[regime][method]:
        text += f" ({g.collapses[regime][method]}/{n} collapsed)"
    return text


def matrix_quotes(g: Grid, regimes_done: Optional[List[str]] = None) -> List[str]:
    """The regime × method matrix of ``regimes_done``, the regimes whose trials have all finished (every regime when
    None: a regime still running would show cells of fewer seeds), best or tied in bold, collapses counted, and the
    regimes that show nothing."""
    done = g.regimes if regimes_done is None else [r for r in g.regimes if r in regimes_done]
    best = {r: set(best_or_tied(g.stats[r])) for r in done}
    out = table(
        ["method", *[f"`{r}`" for r in done]],
        [[f"`{m}`", *[_cell(g, r, m, m in best[r]) for r in done]] for m in g.methods],
    )
    no_difference = [r for r in done if all_tie(g.stats[r])]
    if no_difference:
        verb = "shows" if len(no_difference) == 1 else "show"
        out.append(f"{words([f'`{r}`' for r in no_difference])} {verb} no difference between the methods")
    return out


def candidate_quotes() -> List[str]:
    """The candidates' settings, from the sweep's method table."""
    rows = []
    for m in (*DEFAULT_CANDIDATES, REFERENCE):
        spec = METHODS[m]
        config = spec.get("loss_config", {})
        rows.append(
            [
                f"`{m}`",
                f"`{config.get('ess_scope', 'batch')}`",
                f"`{config.get('trust_region', 'none')}`",
                f"`{config.get('kl_estimator')}` toward `{config.get('kl_anchor')}`",
            ]
        )
    return table(["method", "`ess_scope`", "`trust_region`", "KL term"], rows)


def staleness_quotes(g: Grid, regimes: Optional[List[str]] = None) -> List[str]:
    """How old the data were in each regime (every regime of the set when None; the trial files' ``staleness_mean``
    and ``staleness_max``)."""
    assert g.curves is not None
    runs = g.curves[~g.curves["stage"].str.startswith("lr_")]
    parts, offline = [], []
    for r in g.regimes if regimes is None else regimes:
        rows = runs[runs["stage"] == r]
        if rows["staleness_mean"].isna().all():  # offline rows carry no policy version of this run
            offline.append(f"`{r}`")
            continue
        parts.append(f"`{r}` {rows['staleness_mean'].mean():.2f} (at most {rows['staleness_max'].max():.0f})")
    out = ["The data's mean age in policy versions, over every trial and iteration: " + ", ".join(parts)]
    if offline:
        verb = "trains" if len(offline) == 1 else "train"
        out.append(f"{words(offline)} {verb} on rows another run recorded, which carry no version of this run")
    return out


def choice_quotes(g: Grid) -> List[str]:
    """The rule, each candidate's standing under it and the choice."""
    regimes = g.regimes
    chosen = choose_default(g.stats, g.collapses, DEFAULT_CANDIDATES)
    if chosen != STALENESS_DEFAULT:
        raise ValueError(f"the rule chooses {chosen}, but the grids' STALENESS_DEFAULT is {STALENESS_DEFAULT}")
    rows = []
    for c in DEFAULT_CANDIDATES:
        collapsed = sum(g.collapses[r][c] for r in regimes)
        wins = sum(c in best_or_tied(g.stats[r]) for r in regimes)
        mean = sum(g.stats[r][c][0] for r in regimes) / len(regimes)
        rows.append([f"`{c}`", str(collapsed), f"{wins} of {len(regimes)}", f"{mean:.3f}"])
    return [
        CHOICE_RULE,
        *table(["candidate", "collapsed seeds", "best or tied", "mean held-out"], rows),
        f"The rule chooses `{chosen}`",
    ]


def _mean(column: pd.Series) -> str:
    """The column's mean to 3 decimals; "–" where the method does not report it."""
    return "–" if column.isna().all() else f"{column.mean():.3f}"


# The column `diagnostics_quotes` adds with a sweep grid: the half-width of P3O's ``ess_clip`` trust region at the
# row's mean ESS.
BAND = "its trust region's band ε at that ESS"


def band_at(grid: SweepGrid, regime: str, method: str, ess: float) -> str:
    """``ε = sqrt(1/ESS - 1)`` (`rllib_p3o.core.losses.trust_region.ess_band`: a lagging token whose ratio leaves
    ``[1 - ε, 1 + ε]`` in the direction its advantage pushes gets no policy gradient) at ``ess``, to 3 decimals, where
    ``method`` runs the ``ess_clip`` trust region in ``regime`` (`canonical_method`: it acts there, on lagging rows);
    "–" elsewhere."""
    _, settings, _ = canonical_method(method, REGIMES[regime], grid.method_defaults)
    if dict(settings).get("trust_region") != "ess_clip" or math.isnan(ess):
        return "–"
    _, high = ess_band(torch.tensor(ess, dtype=torch.float64))  # the loss's own band, not a second copy of it
    return f"{float(high) - 1.0:.3f}"


def diagnostics_quotes(
    g: Grid, pairs: Optional[List[Tuple[str, str]]] = None, grid: Optional[SweepGrid] = None
) -> List[str]:
    """The learner's diagnostics per (regime, method) in ``pairs`` (by default: the chosen default and 0.2's in every
    regime of the set), mean over trials and iterations; with the set's sweep ``grid``, also the trust region's band at
    the mean ESS (`band_at`)."""
    assert g.curves is not None
    if pairs is None:
        pairs = [(r, m) for r in g.regimes for m in (STALENESS_DEFAULT, BEFORE)]
    rows = []
    for r, m in pairs:
        trials = _trials(g, r, m)
        rows.append([f"`{r}`", f"`{m}`", *[_mean(trials[col]) for col, _ in DIAGNOSTICS]])
        if grid is not None:
            rows[-1].insert(3, band_at(grid, r, m, trials["ess"].mean()))
    names = [name for _, name in DIAGNOSTICS]
    return table(["regime", "method", *(names[:1] + [BAND] + names[1:] if grid is not None else names)], rows)


def _trials(g: Grid, regime: str, method: str) -> pd.DataFrame:
    """The rows of ``method``'s trials in ``regime`` (every seed, every iteration)."""
    return g.curves[(g.curves["stage"] == regime) & (g.curves["method"] == method)]


def complete(g: Grid, seeds: int, default: str = STALENESS_DEFAULT, grid: Optional[SweepGrid] = None) -> List[str]:
    """The regimes where every method has all its ``seeds`` (a partial set's finished regimes). A partial report has
    rows only for the methods that have started: with the set's sweep ``grid``, a regime is finished only once every
    method the grid runs there has its rows."""
    return [
        r
        for r in g.regimes
        if default in g.stats[r]
        and all(n == seeds for _, _, n in g.stats[r].values())
        and (grid is None or set(grid.methods_in(r)) <= set(g.stats[r]))
    ]


def standing(
    g: Grid, regimes: List[str], default: str = STALENESS_DEFAULT
) -> Tuple[List[str], List[str], List[str], int]:
    """The default's standing over ``regimes``: where it is best or tied, where it is behind, where it is ahead of
    every peer-default loss by more than the standard error, and how many of its seeds collapsed."""
    held = [r for r in regimes if default in best_or_tied(g.stats[r])]
    missed = [r for r in regimes if r not in held]
    ahead = [
        r
        for r in regimes
        if all(verdict(g.stats[r][default], g.stats[r][p]) == "wins" for p in PEER_DEFAULTS if p in g.stats[r])
    ]
    return held, missed, ahead, sum(g.collapses[r][default] for r in regimes)


def aim_quotes(
    g: Grid,
    name: str,
    seeds: int,
    default: str = STALENESS_DEFAULT,
    who: str = "P3O's default",
    grid: Optional[SweepGrid] = None,
) -> List[str]:
    """The issue's aim on one set: the default best or tied in every regime, ahead of every peer-default loss by
    more than the standard error in at least one regime, no collapsed seed (over the set's finished regimes; with the
    set's sweep ``grid``, those where every method it runs has its rows, `complete`)."""
    regimes = complete(g, seeds, default, grid)
    held, missed, ahead, collapsed = standing(g, regimes, default)
    total = sum(g.stats[r][default][2] for r in regimes)
    finished = " finished" if g.note or len(regimes) < len(g.regimes) else ""  # a partial set: so far
    out = [f"On the {name} set {who} is best or tied in {len(held)} of {len(regimes)}{finished} regimes"]
    if missed:
        gaps = []
        for r in missed:
            best = best_method(g, r)
            gaps.append(f"`{r}` ({g.stats[r][default][0] - g.stats[r][best][0]:+.3f} to `{best}`)")
        out.append(f"it is behind in {words(gaps)}")
    out.append(
        f"ahead of every peer's default by more than the standard error in {words([f'`{r}`' for r in ahead])}"
        if ahead
        else "ahead of every peer's default by more than the standard error in no regime"
    )
    out.append(f"{collapsed} of its {total} seeds collapsed")
    return out


def readme_standing(root: str) -> Optional[str]:
    """README's sentence on the complete confirmation set (None while it is partial)."""
    g = load(root, BENCH_CONFIRMATION, GRIDS["sorting", "staleness-confirmation"])
    seeds = len(GRIDS["sorting", "staleness-confirmation"].seeds)
    if g is None or g.note or len(complete(g, seeds)) < len(g.regimes):
        return None
    regimes = list(g.regimes)
    held, missed, ahead, collapsed = standing(g, regimes)
    return (
        f"on its confirmation set, run after the choice on other seeds and {len(regimes)} regimes, it is best or tied "
        f"in {len(held)}, ahead of every peer's default by more than the standard error in {len(ahead)}, behind in "
        f"{words([f'`{r}`' for r in missed])}, with {collapsed} collapsed seeds"
    )


def confirmation_quotes(g: Optional[Grid]) -> List[str]:
    if g is None:
        return ["The confirmation set has not run yet"]
    out = [g.note] if g.note else []
    seeds = len(GRIDS["sorting", "staleness-confirmation"].seeds)
    out += matrix_quotes(g, complete(g, seeds))
    if not complete(g, seeds):
        return out + ["No regime of the confirmation set has all its trials yet, so it confirms nothing so far"]
    out += aim_quotes(g, "confirmation", seeds)
    done = complete(g, seeds)
    out += staleness_quotes(g, done)
    pairs = behind_pairs(g, done)
    if pairs:
        out += diagnostics_quotes(g, pairs)
        out += behind_notes(g, pairs)
    return out


def behind_pairs(g: Grid, done: List[str]) -> List[Tuple[str, str]]:
    """Where the default is behind among the finished regimes ``done``: (regime, method) for the default, the
    reference form and the best method, whose diagnostics the page shows side by side."""
    missed = [r for r in done if STALENESS_DEFAULT not in best_or_tied(g.stats[r])]
    return [(r, m) for r in missed for m in dict.fromkeys((STALENESS_DEFAULT, REFERENCE, best_method(g, r)))]


def behind_notes(g: Grid, pairs: List[Tuple[str, str]]) -> List[str]:
    """What the diagnostics say in the regimes of `behind_pairs`, in two cases the numbers recognise: data that are
    the policy's own and fresh (mean ESS at least 0.999, no token stopped), where the default and the reference form
    compute nearly the same loss, so their gap is the runs' own spread; and a behavior model's rows, which the default
    never clips nor pulls toward that model."""

    def diag(regime: str, method: str, column: str) -> float:
        return float(_trials(g, regime, method)[column].mean())

    def held(regime: str, method: str) -> float:
        return g.stats[regime][method][0]

    notes = []
    for r in dict.fromkeys(r for r, _ in pairs):
        ess, stopped = diag(r, STALENESS_DEFAULT, "ess"), diag(r, STALENESS_DEFAULT, "masked_fraction")
        best = best_method(g, r)
        if ess >= 0.999 and stopped < 0.001:
            notes.append(
                f"In `{r}` the data are the policy's own and fresh (mean ESS {ess:.3f}, {stopped:.3f} of the tokens "
                f"stopped): P3O's default and the reference form compute nearly the same loss there (the KL weight "
                f"1 − ESS is at most 0.001), yet their held-out accuracy differs by "
                f"{held(r, STALENESS_DEFAULT) - held(r, REFERENCE):+.3f}, against a gap of "
                f"{held(r, STALENESS_DEFAULT) - held(r, best):+.3f} to `{best}`: with three seeds the rule calls a gap of "
                "that size behind."
            )
        elif r.startswith("behavior_"):
            collapsed = g.collapses[r].get(REFERENCE, 0)
            fell = f" and collapses in {collapsed} of {g.stats[r][REFERENCE][2]} seeds" if collapsed else ""
            notes.append(
                f"In `{r}` P3O's default has no KL term on the behavior model's rows (KL share of the gradient "
                f"{diag(r, STALENESS_DEFAULT, 'kl_grad_share'):.3f}: they are pulled toward π_old, which with one "
                "optimizer step per batch is the policy itself) and its trust region never clips a second model's "
                f"rows; the reference form is pulled toward the behavior model (KL share "
                f"{diag(r, REFERENCE, 'kl_grad_share'):.3f}){fell}. `{best}` keeps a sequence only where the geometric "
                "mean of π_old/π_b over its tokens lies within its band (the loss reports how many tokens it drops, but "
                "the sweep wrote that figure to trial files only after this set ran: the column is empty here)."
            )
    return notes


def best_method(g: Grid, regime: str) -> str:
    """The method with the highest mean held-out at the budget in ``regime``."""
    return max(g.stats[regime], key=lambda m: g.stats[regime][m][0])


def quotes(root: str) -> List[str]:
    dev = load(root, BENCH_DEVELOPMENT)
    if dev is None:
        raise ValueError(f"no {BENCH_DEVELOPMENT}/summary.json")
    if dev.note:
        raise ValueError(f"the development set is partial: {dev.note}")
    return [
        *candidate_quotes(),
        *staleness_quotes(dev),
        *matrix_quotes(dev),
        TIE_RULE,
        COLLAPSE_RULE,
        *choice_quotes(dev),
        *diagnostics_quotes(dev),
        *aim_quotes(dev, "development", len(GRIDS["sorting", "staleness-development"].seeds)),
        *curve_quotes(root, BENCH_DEVELOPMENT, DEVELOPMENT_FIGURES, list(dev.regimes), "seeds 0-2"),
        *confirmation_quotes(load(root, BENCH_CONFIRMATION, GRIDS["sorting", "staleness-confirmation"])),
    ]


PAGE = Page(
    path="docs/results/staleness.md",
    quotes=quotes,
    settings=(
        "seeds 0-2",
        "seeds 3-5",
        "November 27, 2026",
        "30 iterations of 512 completions",
        "up to 4 weight versions old",
        "4 versions old",
        "8 versions old",
        "four optimizer steps per batch",
        "two optimizer steps per rollout batch",
    ),
)


# -- writing the confirmation section ------------------------------------------------------------------------------

OFFLINE_WEAKER_NOTE = (
    "In `offline_weaker` the rows were recorded by the weaker model, but a trajectory file does not say which model "
    "wrote it: P3O reads them as offline rows of the policy itself, lagging by an unknown number of versions, so its "
    "trust region stops the gradient of every token whose ratio has left the ESS band on the side its advantage "
    "pushes. The losses that learn most there (CISPO, GRPO with truncated importance sampling) truncate a token's "
    "weight and never stop its gradient. A second model's rows in a batch (`behavior_models`) are never clipped; "
    "offline rows have no such mark yet."
)
CURVES_SENTENCE = (
    "Held-out accuracy and the training batch's ESS over training, mean ± std over {seeds}, P3O's default "
    f"(`{STALENESS_DEFAULT}`) thick and black (drawn by the sweep's report from the trial files):"
)
# Where the page's copies of the sets' figures are, relative to the page (`results/<set>/figures/` holds the originals).
DEVELOPMENT_FIGURES = "figures/bench-development"
CONFIRMATION_FIGURES = "figures/bench-confirmation"


def curve_quotes(root: str, folder: str, figures: str, regimes: List[str], seeds: str) -> List[str]:
    """The sentence and the image lines of a set's curves: one figure per regime whose figure the set has."""
    shown = [r for r in regimes if os.path.exists(os.path.join(root, folder, "figures", f"{r}.png"))]
    if not shown:
        return []
    return [CURVES_SENTENCE.format(seeds=seeds), "\n".join(f"![{r}]({figures}/{r}.png)" for r in shown)]


_SECTION_START = "run once after the choice was committed.\n\n"  # the end of the section's fixed introduction
_SUMMARY_START = "confirmation set below says whether that holds on seeds and regimes the choice never saw."


def confirmation_section(root: str) -> str:
    """The confirmation section's text after its introduction, from the committed set (partial or complete)."""
    g = load(root, BENCH_CONFIRMATION, GRIDS["sorting", "staleness-confirmation"])
    if g is None:
        return "The confirmation set has not run yet.\n"
    seeds = len(GRIDS["sorting", "staleness-confirmation"].seeds)
    done = complete(g, seeds)
    matrix = matrix_quotes(g, done)
    parts = ([g.note] if g.note else []) + ["\n".join(q for q in matrix if q.startswith("|"))]
    parts += [q + "." for q in matrix if not q.startswith("|")]
    if not done:
        parts.append(
            "No regime of the confirmation set has all its trials yet, so it confirms nothing so far. The sweep "
            "resumes where it stopped: rerun its command."
        )
        return "\n\n".join(parts) + "\n"
    parts.append("; ".join(aim_quotes(g, "confirmation", seeds)) + ".")
    if len(done) < len(g.regimes):
        parts.append(
            "Bold marks best or tied only in the regimes whose trials have all finished; the others are still "
            "running. The sweep resumes where it stopped: rerun its command."
        )
    elif g.note:
        parts.append(
            "The other regimes of the set have not run yet, so this confirms the choice in these regimes only. The "
            "sweep resumes where it stopped: rerun its command."
        )
    parts.append("; ".join(staleness_quotes(g, done)) + ".")
    pairs = behind_pairs(g, done)
    if pairs:
        parts.append(
            "Where it is behind, the learner's diagnostics (mean over trials and iterations) beside the reference "
            "form's and the best method's:"
        )
        parts.append("\n".join(diagnostics_quotes(g, pairs)))
        if any(r == "offline_weaker" for r, _ in pairs):
            parts.append(OFFLINE_WEAKER_NOTE)
        parts += behind_notes(g, pairs)
    parts += curve_quotes(root, BENCH_CONFIRMATION, CONFIRMATION_FIGURES, done, "seeds 3-5")
    return "\n\n".join(parts) + "\n"


def copy_figures(root: str) -> List[str]:
    """Copy the confirmation set's figures the section shows into the docs (`CONFIRMATION_FIGURES`, beside the page);
    returns the copies' paths."""
    text = confirmation_section(root)
    copied = []
    for name in re.findall(rf"\]\({re.escape(CONFIRMATION_FIGURES)}/([^)]+)\)", text):
        target = os.path.join(root, os.path.dirname(PAGE.path), CONFIRMATION_FIGURES, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(root, BENCH_CONFIRMATION, "figures", name), target)
        copied.append(target)
    return copied


def confirmation_summary(root: str) -> Optional[str]:
    """The page summary's sentence on the confirmation set's standing (None before any regime has finished)."""
    g = load(root, BENCH_CONFIRMATION, GRIDS["sorting", "staleness-confirmation"])
    seeds = len(GRIDS["sorting", "staleness-confirmation"].seeds)
    if g is None or not complete(g, seeds):
        return None
    aim = aim_quotes(g, "confirmation", seeds)
    standing = aim[0] + (f"; {aim[1]}" if aim[1].startswith("it is behind") else "")
    return standing + (" (the set is still running)." if g.note else ".")


def write_page(root: str) -> None:
    """Rewrite the page's confirmation section and its summary sentence from the committed confirmation set, and copy
    the figures it shows into the docs."""
    path = os.path.join(root, PAGE.path)
    with open(path) as f:
        text = f.read()
    text = text[: text.index(_SECTION_START) + len(_SECTION_START)] + confirmation_section(root)
    summary = confirmation_summary(root)
    if summary:
        start = text.index(_SUMMARY_START)
        end = text.index("\n", start)
        text = text[:start] + f"{_SUMMARY_START} {summary}" + text[end:]
    with open(path, "w") as f:
        f.write(text)
    copy_figures(root)


if __name__ == "__main__":  # python -m results_check.pages.staleness: after committing a new confirmation report
    write_page(".")
