"""The results check (`python -m results_check`): every results page agrees with its committed result files, and
a page or a file changed by one number fails it. Reads files only (no Ray)."""

import glob
import json
import os
import shutil

import pytest

from results_check import cli
from results_check.page import COMMIT_HASH, UNCHECKED_NOTE, Page, check_page
from results_check.registry import PAGES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("page", PAGES, ids=[p.path for p in PAGES])
def test_the_page_agrees_with_its_result_files(page):
    assert check_page(page) == []


def _copy(tmp_path, *paths):
    for path in paths:
        src, dst = os.path.join(ROOT, path), os.path.join(tmp_path, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
    return str(tmp_path)


def _edit(root, path, old, new):
    full = os.path.join(root, path)
    with open(full) as f:
        text = f.read()
    assert text.count(old) >= 1, f"{old!r} not in {path}"
    with open(full, "w") as f:
        f.write(text.replace(old, new, 1))


SWEEP_PAGE = next(p for p in PAGES if p.path == "docs/results/claims-sweep.md")


def test_the_check_has_no_import_cycle(monkeypatch):
    """Pages import `Page` from `results_check.page`; the list of pages (`results_check.registry`) imports the pages;
    nothing imports back up (read from the sources, as `tests/test_layout.py` reads the package)."""
    import pathlib

    import test_layout

    monkeypatch.setattr(test_layout, "PACKAGE", pathlib.Path(ROOT) / "results_check")
    graph = test_layout.import_graph()
    assert "results_check.page" in graph["results_check.pages.claims"]  # the graph sees the check's modules
    assert "results_check.pages.claims" in graph["results_check.registry"]
    assert test_layout.find_cycle(graph) == []


def test_one_number_changed_in_a_summary_file_fails_the_check(tmp_path):
    root = _copy(tmp_path, SWEEP_PAGE.path, "results/sweep")
    assert check_page(SWEEP_PAGE, root) == []
    path = os.path.join(root, "results/sweep/summary.json")
    with open(path) as f:
        summary = json.load(f)
    summary["startup"]["reused_actor_setup_s_mean"] = 0.12  # the page says 0.09 s
    with open(path, "w") as f:
        json.dump(summary, f)
    problems = check_page(SWEEP_PAGE, root)
    assert any("0.12 s on average" in p for p in problems), problems


def test_one_held_out_value_changed_in_the_curves_changes_a_verdict(tmp_path):
    root = _copy(tmp_path, SWEEP_PAGE.path, "results/sweep")
    # P3O's last held-out in one async seed: 0.985 → 0.885 moves its mean out of a tie with GRPO ε 0.4.
    path = os.path.join(root, "results/sweep/curves.csv")
    import pandas as pd

    curves = pd.read_csv(path)
    rows = curves[(curves.stage == "async_staleness_2") & (curves.method == "p3o") & (curves.seed == 0)]
    last = rows.dropna(subset=["heldout"]).index[-1]
    curves.loc[last, "heldout"] -= 0.1
    curves.to_csv(path, index=False)
    problems = check_page(SWEEP_PAGE, root)
    assert any("ties with GRPO ε 0.2" in p or "| `async_staleness_2` |" in p for p in problems), problems


def test_one_number_changed_on_the_page_fails_the_check(tmp_path):
    root = _copy(tmp_path, SWEEP_PAGE.path, "results/sweep")
    _edit(root, SWEEP_PAGE.path, "0.985 ± 0.005", "0.986 ± 0.005")
    assert check_page(SWEEP_PAGE, root)
    root2 = _copy(tmp_path / "b", SWEEP_PAGE.path, "results/sweep")
    _edit(root2, SWEEP_PAGE.path, "The task saturates quickly", "The task saturates within 3 iterations")
    problems = check_page(SWEEP_PAGE, root2)
    assert any("number '3' is derived by nothing" in p for p in problems), problems


def _set(path, keys, value):
    """Set ``report[k0][k1]...`` in a JSON result file."""

    def edit(root):
        full = os.path.join(root, path)
        with open(full) as f:
            report = json.load(f)
        node = report
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        with open(full, "w") as f:
            json.dump(report, f)

    return edit


def _set_row(path, stage, method, mean):
    """Set one (stage, method) row's mean held-out at the budget in a sweep's summary.json."""

    def edit(root):
        full = os.path.join(root, path)
        with open(full) as f:
            report = json.load(f)
        (row,) = [r for r in report["summary"] if (r["stage"], r["method"]) == (stage, method)]
        row["heldout_at_budget_mean"] = mean
        with open(full, "w") as f:
            json.dump(report, f)

    return edit


ADDITION_FILES = [
    "results/bench-addition-development",
    "results/bench-addition-confirmation",
    "results/bench-addition-confirmation-rate",
    "results/bench-provenance-confirmation",
    "rllib_p3o/tasks/addition.py",
]
# (page, the files it reads, one number changed in one of them, what the check then says the page should contain)
ONE_NUMBER_CHANGED = [
    (
        "docs/results/demo.md",
        ["results/benchmarks/demo_seeds.json", "rllib_p3o/tasks/tiny_model.py"],
        _set("results/benchmarks/demo_seeds.json", ["runs", 4, "iterations_to_target"], 250),  # base 2, RL 0: 245
        "| 2 | 0.295 | 0.915, 136 s (250) | 0.925, 75 s (145) |",
    ),
    (
        "docs/results/demo.md",
        ["results/benchmarks/demo_seeds.json", "rllib_p3o/tasks/tiny_model.py"],
        lambda root: _edit(
            root, "rllib_p3o/tasks/tiny_model.py", "correct_fraction: float = 0.4,", "correct_fraction: float = 0.5,"
        ),
        "where only 50% of those lines have the right answer",
    ),
    (
        "docs/results/tool-use.md",
        ["results/benchmarks/tool_use_seeds.json", "rllib_p3o/tasks/products.py"],
        _set("results/benchmarks/tool_use_seeds.json", ["runs", 3, "with_tool", "train_time_s"], 18.0),  # 19.4 s
        "| 1 | 0 | 0.140 → 0.950, 12, 18.0 s | 0.170 (36) |",
    ),
    (
        "docs/results/faults.md",
        ["results/benchmarks/faults.json"],
        _set("results/benchmarks/faults.json", ["runner_kill", "seconds_to_recover"], 16.2),  # 14 s
        "runner back, with verified weights, 16 s (7 iterations) after the kill",
    ),
    (
        "docs/results/provenance.md",
        [f"results/bench-provenance-{s}" for s in ("development", "first-confirmation", "confirmation")]
        + ["results/bench-provenance-confirmation-rate"],
        _set("results/bench-provenance-confirmation-rate/summary.json", ["summary", 0, "heldout_at_budget_mean"], 0.9),
        "scores 0.900 ± 0.027 (0 of 3 seeds collapsed)",  # 0.856: the default at the best method's rate
    ),
    (
        "docs/results/provenance.md",
        [f"results/bench-provenance-{s}" for s in ("development", "first-confirmation", "confirmation")]
        + ["results/bench-provenance-confirmation-rate"],
        _set_row("results/bench-provenance-confirmation/summary.json", "behavior_stronger", "p3o_clip_version", 0.7),
        "at 0.00025 that loss scores 0.700 ± 0.028, behind `cispo`",  # 0.737: p3o_clip_version in behavior_stronger
    ),
    (
        "docs/results/addition.md",
        ADDITION_FILES,
        lambda root: _edit(
            root,
            "results/bench-addition-development/trials/lr_on_policy/cispo_seed0_lr0.001.csv",
            "30,123.58859634399414,0.61875",
            "30,123.58859634399414,0.51875",
        ),
        "0.641 ± 0.172",  # cispo at lr 0.001 on seeds 0-1: 0.691 ± 0.102
    ),
    (
        "docs/results/addition.md",
        ADDITION_FILES,
        _set("results/bench-addition-confirmation-rate/summary.json", ["summary", 0, "heldout_at_budget_mean"], 0.7),
        "scores 0.700 ± 0.031 (0 of 3 seeds collapsed)",  # 0.607: the default at the best method's rate
    ),
]


@pytest.mark.parametrize(
    "page_path,files,change,expected",
    ONE_NUMBER_CHANGED,
    ids=[f"{c[0].split('/')[-1]}-{i}" for i, c in enumerate(ONE_NUMBER_CHANGED)],
)
def test_one_number_changed_in_a_pages_source_file_fails_the_check(tmp_path, page_path, files, change, expected):
    page = next(p for p in PAGES if p.path == page_path)
    root = _copy(tmp_path, page.path, *files)
    assert check_page(page, root) == []
    change(root)
    problems = check_page(page, root)
    assert any(expected in p for p in problems), problems


def test_a_section_without_a_committed_file_must_say_so(tmp_path):
    page_path = "page.md"
    with open(tmp_path / page_path, "w") as f:
        f.write(
            '# T\n\n!!! info "How this was measured"\n    - **Command:** `x`\n    - **Version:** 1\n'
            "    - **Machine:** m\n\n## Old A/B\n\nIt took 12 ms.\n\n## Result\n\nIt took 3 s.\n"
        )
    page = Page(page_path, quotes=lambda root: ["It took 3 s."], unchecked={"Old A/B": "not kept"})
    assert check_page(page, str(tmp_path)) == [
        f"unchecked section 'Old A/B' (not kept) does not say {UNCHECKED_NOTE!r}"
    ]
    _edit(str(tmp_path), page_path, "It took 12 ms.", f"It took 12 ms; {UNCHECKED_NOTE}.")
    assert check_page(page, str(tmp_path)) == []
    _edit(str(tmp_path), page_path, "It took 3 s.", "It took 3 s. Or 4.")
    assert [p[:31] for p in check_page(page, str(tmp_path))] == ["number '4' is derived by nothin"]


def test_the_command_line_check_exits_non_zero_on_a_disagreeing_page(tmp_path, capsys):
    root = _copy(tmp_path, SWEEP_PAGE.path, "results/sweep")
    assert cli.main([SWEEP_PAGE.path, "--root", root]) == 0
    _edit(root, SWEEP_PAGE.path, "63.7 min", "64.0 min")
    assert cli.main([SWEEP_PAGE.path, "--root", root]) == 1
    assert "63.7 min" in capsys.readouterr().out  # what the page should say


def test_the_changelog_is_history_by_version():
    """CHANGELOG.md: one section per version, no commit hashes, no per-commit tables (the one table is "Moved in",
    old names and where they are now)."""
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        text = f.read()
    assert COMMIT_HASH.findall(text) == []
    section, tables = "", []
    for line in text.splitlines():
        section = line if line.startswith("#") else section
        if line.startswith("|") and not section.startswith("### Moved in"):
            tables.append(line)
    assert not tables
    versions = [line for line in text.splitlines() if line.startswith("## ")]
    assert versions and all(line.startswith("## [") for line in versions), versions


def _embedded_images():
    import re

    found = []
    for page in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
        with open(page) as f:
            for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", f.read()):
                found.append(os.path.normpath(os.path.join(os.path.dirname(page), link)))
    return found


def test_every_image_of_the_site_is_embedded_and_no_raw_data_is_in_it():
    embedded = set(_embedded_images())
    images = {p for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.png"), recursive=True)}
    assert images - embedded == set(), "images under docs/ that no page embeds"
    assert embedded - images == set(), "embedded images that do not exist"
    data = [
        p
        for ext in ("csv", "json", "parquet")
        for p in glob.glob(os.path.join(ROOT, "docs", "**", f"*.{ext}"), recursive=True)
    ]
    assert data == [], "raw data belongs in results/ (outside the site)"


def test_the_pages_figures_are_copies_of_their_runs_figures():
    """docs/results/figures/<run>/<name>.png is results/<run>/<name>.png or results/<run>/figures/<name>.png."""
    figures = glob.glob(os.path.join(ROOT, "docs", "results", "figures", "*", "*.png"))
    assert figures
    for copy in figures:
        run, name = os.path.basename(os.path.dirname(copy)), os.path.basename(copy)
        sources = [os.path.join(ROOT, "results", run, name), os.path.join(ROOT, "results", run, "figures", name)]
        source = next((s for s in sources if os.path.exists(s)), None)
        assert source, f"{copy} has no original under results/{run}/"
        with open(copy, "rb") as a, open(source, "rb") as b:
            assert a.read() == b.read(), f"{copy} differs from {source}: copy it again"


def test_the_claims_page_fails_when_a_result_of_p3os_default_changes(tmp_path):
    """docs/results/claims.md against results/bench/summary.json: the default's held-out with the weaker behavior
    model 0.1 lower changes its table rows, its verdicts and the page's summary, and the check says so."""
    page = next(p for p in PAGES if p.path == "docs/results/claims.md")
    files = (
        "results/bench/summary.json",
        "results/bench/lr_choice.json",
        "results/bench/curves.csv",
        "results/bench-two-step/summary.json",
    )
    root = _copy(tmp_path, page.path, *files)
    assert check_page(page, root) == []
    path = os.path.join(root, "results/bench/summary.json")
    with open(path) as f:
        summary = json.load(f)
    row = next(r for r in summary["summary"] if (r["stage"], r["method"]) == ("behavior_weaker", "p3o_default"))
    row["heldout_at_budget_mean"] -= 0.1
    with open(path, "w") as f:
        json.dump(summary, f)
    problems = check_page(page, root)
    assert any(p.startswith("derived text not on the page: | `behavior_weaker` |") for p in problems), problems
    assert any("the weaker behavior model it ends at" in p for p in problems), problems


def test_a_partial_sets_matrix_shows_only_its_finished_regimes():
    """A regime still running has cells of fewer seeds: the matrix of a partial set leaves it out."""
    from results_check.pages.staleness import Grid, complete, matrix_quotes

    stats = {
        "on_policy": {"a": (0.8, 0.01, 3), "b": (0.7, 0.01, 3)},
        "async_staleness_4": {"a": (0.9, 0.0, 1), "b": (0.5, 0.02, 3)},
    }
    collapses = {r: {m: 0 for m in s} for r, s in stats.items()}
    g = Grid("x", {}, {}, list(stats), ["a", "b"], stats, collapses, None)
    done = complete(g, 3, "a")
    assert done == ["on_policy"]
    header, _, row_a, row_b = matrix_quotes(g, done)
    assert header == "| method | `on_policy` |"
    assert (row_a, row_b) == ("| `a` | **0.800 ± 0.010** |", "| `b` | 0.700 ± 0.010 |")
    assert "`async_staleness_4`" in matrix_quotes(g)[0]  # every regime when the set is complete


def test_the_default_is_counted_apart_where_each_of_its_additions_acts_and_the_files_must_agree():
    """The provenance page counts P3O's default's standing where its trust region acts (own lagging tokens), where its
    weight on another model's rows acts and where neither does, from the regimes' traits; the tokens the trust
    region stopped in the files must agree (above 0 exactly where the policy's own tokens lag), or the page fails."""
    import pandas as pd

    from results_check.pages.provenance import scope_quote
    from results_check.pages.staleness import Grid

    stats = {
        "async_staleness_4": {"d": (0.8, 0.01, 3), "b": (0.7, 0.01, 3)},
        "behavior_weaker": {"d": (0.6, 0.01, 3), "b": (0.7, 0.01, 3)},
        "on_policy": {"d": (0.8, 0.01, 3), "b": (0.8, 0.01, 3)},
    }
    stopped = {"async_staleness_4": 0.04, "behavior_weaker": 0.0, "on_policy": 0.0}
    curves = pd.DataFrame([{"stage": r, "method": "d", "masked_fraction": f} for r, f in stopped.items()])
    g = Grid("x", {}, {}, list(stats), ["d", "b"], stats, {r: {"d": 0, "b": 0} for r in stats}, curves)
    said = scope_quote(g, list(stats), default="d")
    assert "(the policy's own tokens lag: `async_staleness_4`) it is best or tied in 1 of 1;" in said
    assert "(`behavior_weaker`) in 0 of 1;" in said
    assert said.endswith(
        "(one policy version, no other model: `on_policy`) in 1 of 1, 1 of them a regime where every method ties"
    )
    curves.loc[curves["stage"] == "on_policy", "masked_fraction"] = 0.01
    with pytest.raises(ValueError, match="on_policy: the trust region stopped 0.0100"):
        scope_quote(g, list(stats), default="d")


def test_where_another_model_wrote_rows_the_page_says_whether_the_default_ends_above_its_start():
    """`start_quote`: the mean held-out accuracy at the first evaluation and at the budget, and the seeds that end
    above their own start, counted per seed (one seed below its start is counted as not above)."""
    import pandas as pd

    from results_check.pages.provenance import start_quote
    from results_check.pages.staleness import Grid

    heldout = {0: (0.3, 0.6), 1: (0.3, 0.5), 2: (0.3, 0.2)}  # seed: (iteration 1, iteration 30)
    curves = pd.DataFrame(
        [
            {"stage": "offline_weaker", "method": "d", "seed": seed, "iteration": it, "heldout": value}
            for seed, values in heldout.items()
            for it, value in zip((30, 1), reversed(values))  # rows out of order: the first evaluation is by iteration
        ]
        + [{"stage": "on_policy", "method": "d", "seed": 0, "iteration": 1, "heldout": 0.9}]
    )
    g = Grid("x", {}, {}, ["offline_weaker", "on_policy"], ["d"], {}, {}, curves)
    assert start_quote(g, ["offline_weaker", "on_policy"], default="d").endswith(
        ": `offline_weaker` 0.300 → 0.433, above its start in 2 of 3 seeds"
    )


def test_the_addition_pages_lr_stage_says_whether_it_has_finished_and_shows_complete_cells_only(tmp_path):
    """An lr stage's bracket may still grow while it runs: the page calls its best cell the best so far until a later
    stage has a trial file, shows only the cells every seed has run, and the base model's start is one value per seed
    (two trials of a seed that disagree fail)."""
    import pandas as pd

    from results_check.pages import addition

    trials = tmp_path / addition.BENCH_ADDITION_DEVELOPMENT / addition.report.TRIALS_DIR
    (trials / "lr_on_policy").mkdir(parents=True)

    def trial(method, lr, seed, last, first=None):
        rows = [
            {"iteration": 1, "heldout": 0.3 + seed / 100 if first is None else first},
            {"iteration": 30, "heldout": last},
        ]
        frame = pd.DataFrame([{**r, "method": method, "lr_peak": lr, "seed": seed} for r in rows])
        frame.to_csv(trials / "lr_on_policy" / f"{method}_seed{seed}_lr{lr}.csv", index=False)

    for seed, last in enumerate((0.9, 0.8)):
        trial("cispo", 0.0005, seed, last)
        trial("grpo_eps0.2", 0.0005, seed, last)  # the same computation on-policy: the same ends
        trial("grpo_eps0.4", 0.0005, seed, last - 0.01 * seed)  # one seed apart: not the same
    trial("m2po", 0.001, 0, 0.95)  # one seed of the lr stage's two: not a cell yet
    running = addition.on_policy_quotes(str(tmp_path))
    assert running[0].startswith("The stage is still running: 3 cells have all 2 seeds")
    assert running[1].startswith("The base model answers 0.305 ") and "0.300 and 0.310 on seeds 0 and 1" in running[1]
    assert "| `cispo` | **0.850 ± 0.071** |" in running and not any("m2po" in q for q in running)
    assert any(q.startswith("The best cell so far is `cispo` at lr 0.0005") for q in running)
    assert [q for q in running if "exactly the same" in q][0].startswith("`cispo` and `grpo_eps0.2` end at")
    assert sum("exactly the same" in q for q in running) == 1
    assert running[-1].endswith("on-policy within the budget): it does")
    (trials / "lr_async_staleness_4").mkdir()
    (trials / "lr_async_staleness_4" / "cispo_seed0_lr0.0005.csv").write_text("iteration\n1\n")
    assert addition.on_policy_quotes(str(tmp_path))[0] == "The stage has finished"
    trial("m2po", 0.001, 0, 0.95, first=0.35)
    with pytest.raises(ValueError, match="differs between trials of a seed"):
        addition.on_policy_quotes(str(tmp_path))


def test_the_regime_by_task_table_shows_each_sets_finished_regimes_only_and_says_what_it_does_not_run(tmp_path):
    """The addition page's regime × task table, on the committed sorting confirmation set (hand-read from its page:
    behind by 0.104 in four steps per batch, ahead of every peer in calls in flight, every method tied on-policy) and
    a hand-made addition confirmation report: a finished regime where the default is ahead of every peer, one where
    it is behind with a collapsed seed, one still running (two of three seeds), one not started."""
    import json
    import shutil

    from results_check.pages import addition
    from results_check.pages.staleness import PEER_DEFAULTS

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sorting = tmp_path / addition.BENCH_PROVENANCE_CONFIRMATION
    sorting.mkdir(parents=True)
    shutil.copy(os.path.join(root, addition.BENCH_PROVENANCE_CONFIRMATION, "summary.json"), sorting)

    def row(stage, method, mean, std=0.01, seeds=3, collapses=0):
        return dict(stage=stage, method=method, heldout_at_budget_mean=mean, heldout_at_budget_std=std, seeds=seeds,
                    collapses=collapses)  # fmt: skip

    default = addition.DEFAULT_METHOD
    others = [m for m in addition.CONFIRMATION.methods if m != default]
    assert set(PEER_DEFAULTS) <= set(others)
    rows = [row("offline_weaker", default, 0.70)] + [row("offline_weaker", m, 0.50) for m in others]
    rows += [row("async_staleness_8", default, 0.40, std=0.2, collapses=1)]
    rows += [row("async_staleness_8", m, 0.76 if m == "cispo" else 0.75) for m in others]
    rows += [row("on_policy", default, 0.9, seeds=2)] + [row("on_policy", m, 0.9) for m in others]
    rows += [row("async_staleness_4", default, 0.9)]  # every seed of the default, no other method's yet: running
    confirmation = tmp_path / addition.BENCH_ADDITION_CONFIRMATION
    confirmation.mkdir(parents=True)
    (confirmation / "summary.json").write_text(json.dumps({"note": "Partial: ...", "summary": rows}))

    quotes = addition.regime_task_quotes(str(tmp_path))
    split = [q[2:-2].split(" | ") for q in quotes if q.startswith("| `")]  # "| `regime` | a | b | c |"
    cells = {c[0].strip("`"): c[1:] for c in split}
    assert quotes[0] == (
        "| regime | sorting, confirmation (seeds 9-11) | addition, development (seeds 0-2) "
        "| addition, confirmation (seeds 3-5) |"
    )
    assert cells["four_steps_per_batch"][0] == "behind (-0.104 to `grpo_seq_mask_eps0.4`)"
    assert cells["async_4_in_flight"][0] == "best or tied, ahead of every peer's default"
    assert cells["on_policy"][0] == "best or tied (every method ties: no evidence)"
    assert cells["offline_weaker"] == ["best or tied", "not run yet", "best or tied, ahead of every peer's default"]
    assert cells["async_staleness_8"][2] == "behind (-0.360 to `cispo`), 1 of 3 seeds collapsed"
    assert cells["on_policy"][2] == "running" and cells["temperature_1.2"][2] == "not run yet"
    assert cells["async_staleness_4"][2] == "running"
    assert cells["bf16_rollouts"][1:] == ["–", "–"] and cells["async_staleness_4_inflight"][0] == "–"
    assert quotes[-3] == (
        "The sorting task's confirmation set: best or tied in 9 of its 13 regimes (in 1 of them every method ties: no "
        "evidence); ahead of every peer's default by more than the SE in 1"
    )
    assert quotes[-2] == "The addition task's development set: no regime finished yet"
    assert quotes[-1] == (
        "The addition task's confirmation set: best or tied in 1 of 2 finished regimes of 11; ahead of every peer's "
        "default by more than the SE in 1"
    )


def test_readmes_sentence_on_both_tasks_waits_for_both_confirmation_sets_and_sorts_regimes_by_where_they_hold(
    tmp_path,
):
    """The committed sorting confirmation set (behind in four and two steps per batch and with a live weaker model;
    ahead of every peer with calls in flight) beside a hand-made addition one, complete in every regime: the
    default behind `cispo` in four steps per batch and at staleness 8, ahead of it elsewhere. No sentence while the
    addition set is partial."""
    import json
    import shutil

    from results_check.pages import addition

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sorting = tmp_path / addition.BENCH_PROVENANCE_CONFIRMATION
    sorting.mkdir(parents=True)
    shutil.copy(os.path.join(root, addition.BENCH_PROVENANCE_CONFIRMATION, "summary.json"), sorting)
    behind = ("four_steps_per_batch", "async_staleness_8")
    rows = []
    for regime in addition.CONFIRMATION.regimes:
        for method in addition.CONFIRMATION.methods:
            mean = 0.8 if method == addition.DEFAULT_METHOD else 0.5
            if regime in behind and method in (addition.DEFAULT_METHOD, "cispo"):
                mean = 1.3 - mean  # the default 0.5, cispo 0.8
            rows.append(dict(stage=regime, method=method, heldout_at_budget_mean=mean, heldout_at_budget_std=0.01,
                             seeds=3, collapses=0))  # fmt: skip
    folder = tmp_path / addition.BENCH_ADDITION_CONFIRMATION
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"note": "Partial: 1 trial not yet", "summary": rows}))
    assert addition.readme_both_tasks(str(tmp_path)) is None
    (folder / "summary.json").write_text(json.dumps({"note": None, "summary": rows}))
    assert addition.readme_both_tasks(str(tmp_path)) == (
        "on both tasks' confirmation sets (sorting and addition, 10 regimes both run) P3O's default is best or tied on "
        "both in `offline_weaker`, `async_4_in_flight`, `async_staleness_4`, `offline_stale` and `temperature_1.2`, "
        "on sorting only in `async_staleness_8`, on addition only in `two_steps_per_batch` and `behavior_weaker`, "
        "behind on both in `four_steps_per_batch`; every method ties on one task or both in `on_policy`; ahead of "
        "every peer's default by more than the standard error on both in `async_4_in_flight`"
    )


def test_readmes_addition_clause_follows_its_development_set_and_says_while_the_confirmation_runs(tmp_path):
    """README's clause on the addition task: nothing while the development set is partial; once it is complete, the
    default's standing there and "under way" until the confirmation set is complete, then without it."""
    import json
    import shutil

    from results_check.pages import addition

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dev = tmp_path / addition.BENCH_ADDITION_DEVELOPMENT
    shutil.copytree(os.path.join(root, addition.BENCH_ADDITION_DEVELOPMENT), dev, ignore=shutil.ignore_patterns("prep"))
    summary = json.loads((dev / "summary.json").read_text())
    rows = [dict(stage=r, method=m, heldout_at_budget_mean=0.9, heldout_at_budget_std=0.01, seeds=3, collapses=0)
            for r in addition.DEVELOPMENT.regimes for m in addition.DEVELOPMENT.methods]  # fmt: skip
    rows[0] = dict(rows[0], heldout_at_budget_mean=0.5)  # on_policy: the first method (not the default) behind
    behind = next(i for i, r in enumerate(rows) if r["stage"] == "async_staleness_4" and r["method"] == "m2po")
    rows[behind] = dict(rows[behind], heldout_at_budget_mean=0.95)
    (dev / "summary.json").write_text(json.dumps({"note": "Partial: 1 trial not yet", "summary": rows}))
    assert addition.readme_development(str(tmp_path)) is None
    (dev / "summary.json").write_text(json.dumps({**summary, "note": None, "summary": rows}))
    said = addition.readme_development(str(tmp_path))
    assert said == (
        "on its development set (seeds 0-2, which chose the learning rates) P3O's default is best or tied in 3 of 4 "
        "regimes; it is behind in `async_staleness_4` (-0.050 to `m2po`); ahead of every peer's default by more than "
        "the standard error in no regime; its confirmation set (seeds 3-5) is under way"
    )
    _addition_confirmation(tmp_path / addition.BENCH_ADDITION_CONFIRMATION, "on_policy", addition.DEFAULT_METHOD)
    assert addition.readme_development(str(tmp_path)) == said.split("; its confirmation set")[0]


def test_the_provenance_aim_says_where_no_run_isolates_why_the_default_is_behind(tmp_path):
    """Without the rate diagnosis's files, the two several-steps regimes where P3O's default is behind have no run
    that isolates why, and the page's aim section says so; with them, the rate does."""
    import shutil

    from results_check.pages import provenance

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = provenance.BENCH_PROVENANCE_CONFIRMATION
    shutil.copytree(os.path.join(root, folder), tmp_path / folder)
    without = provenance.aim_verdict_quotes(str(tmp_path))
    assert (
        without[0].startswith("The aim on the confirmation set (")
        and " is not met: it is behind in 4 of 13" in without[0]
    )
    assert [q for q in without if "no run of this page isolates why" in q] == [
        "`four_steps_per_batch` (-0.104 to `grpo_seq_mask_eps0.4`): no run of this page isolates why",
        "`two_steps_per_batch` (-0.031 to `grpo_tis_eps0.2`): no run of this page isolates why",
    ]
    rate = provenance.BENCH_PROVENANCE_RATE
    shutil.copytree(os.path.join(root, rate), tmp_path / rate)
    diagnosed = provenance.aim_verdict_quotes(str(tmp_path))
    assert diagnosed[1:3] == [
        "`four_steps_per_batch` (-0.104 to `grpo_seq_mask_eps0.4`): the same update at `grpo_seq_mask_eps0.4`'s rate "
        "is tied with it (+0.008, SE 0.021); the rate explains the gap",
        "`two_steps_per_batch` (-0.031 to `grpo_tis_eps0.2`): the same update at `grpo_tis_eps0.2`'s rate is tied "
        "with it (-0.014, SE 0.021), but its gain over its own rate (+0.017, SE 0.027) is within the SE: "
        "inconclusive, the rate may explain it",
    ]
    assert diagnosed[4].endswith(
        "behind `cispo` (-0.041, SE 0.036): the rate accounts for 0.087 of the gap (SE 0.022), the loss at that rate "
        "for the other 0.041"
    )


def test_the_addition_pages_lr_figure_is_drawn_from_the_committed_trials_of_its_stage(tmp_path):
    """The on-policy lr stage's figure (one line per peak) is what `python -m results_check.pages.addition` draws from
    the committed trial files: drawn again here, it is the committed file byte for byte (matplotlib's Agg output is
    deterministic for one version, which the lock pins); with no trial file there is no figure."""
    import shutil

    from results_check.pages import addition

    folder = addition.BENCH_ADDITION_DEVELOPMENT
    assert (
        addition.lr_figure(str(tmp_path), str(tmp_path / "none.png")) is None and not (tmp_path / "none.png").exists()
    )
    shutil.copytree(os.path.join(ROOT, folder, "trials"), tmp_path / folder / "trials")
    committed = sorted(os.listdir(os.path.join(ROOT, folder, "figures")))
    assert addition.LR_FIGURE_NAME in committed  # with each later stage's that the page shows
    for name in committed:
        stage = name[: -len(".png")]
        drawn = addition.lr_figure(str(tmp_path), str(tmp_path / name), stage)
        with open(drawn, "rb") as a, open(os.path.join(ROOT, folder, "figures", name), "rb") as b:
            assert a.read() == b.read(), (
                f"the committed {name} is not the trial files': run python -m results_check.pages.addition"
            )
        page_copy = os.path.join(ROOT, "docs", "results", addition.figure_path(stage))
        with open(drawn, "rb") as a, open(page_copy, "rb") as b:
            assert a.read() == b.read(), f"{page_copy} is not the set's figure"


def _addition_confirmation(folder, behind_in: str, best: str, others: float = 0.5) -> None:
    """A hand-made complete addition confirmation set: P3O's default 0.8 and every other method ``others`` in every
    regime, but ``best`` 0.8 and the default ``others`` in ``behind_in``; each method's rate 1.25e-4 in every family,
    ``best``'s 2.5e-4; a curves.csv with the learner's diagnostics of both in ``behind_in`` (ESS 0.9 and 0.6) and of
    every method elsewhere (ESS 0.8)."""
    import json

    import pandas as pd

    from results_check.pages import addition
    from rllib_p3o.sweep.grid import LR_FAMILY_REGIMES, family_key

    grid = addition.CONFIRMATION
    rows = []
    for regime in grid.regimes:
        for method in grid.methods:
            mean = 0.8 if method == addition.DEFAULT_METHOD else others
            if regime == behind_in and method in (addition.DEFAULT_METHOD, best):
                mean = 0.8 + others - mean
            rows.append(dict(stage=regime, method=method, heldout_at_budget_mean=mean, heldout_at_budget_std=0.01,
                             seeds=3, collapses=0))  # fmt: skip
    lr_peak = {family_key(m, f): (2.5e-4 if m == best else 1.25e-4) for m in grid.methods for f in LR_FAMILY_REGIMES}
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"note": None, "summary": rows, "lr_peak": lr_peak}))
    curves = [
        dict(
            stage=behind_in,
            method=m,
            seed=s,
            iteration=i,
            heldout=0.5,
            ess=ess,
            cap_fraction=0.1,
            masked_fraction=0.0,
            ratio_max=2.0,
            kl_grad_share=0.05,
        )  # fmt: skip
        for m, ess in ((addition.DEFAULT_METHOD, 0.9), (best, 0.6))
        for s in grid.seeds
        for i in (1, 2)
    ]
    curves += [
        dict(curves[0], stage=regime, method=m, ess=0.8)
        for regime in grid.regimes
        if regime != behind_in
        for m in grid.methods
    ]
    pd.DataFrame(curves).to_csv(folder / "curves.csv", index=False)


def test_the_addition_page_says_whether_the_aim_is_met_with_the_diagnostics_where_it_is_behind(tmp_path):
    """The addition page on the committed development set and sorting confirmation set, with a hand-made lr choice and
    a hand-made complete confirmation set where P3O's default is behind `cispo` in four steps per batch: the page
    written from them passes its own check, says the aim is not met, and gives that regime's rates and the learner's
    diagnostics of both methods; with the default ahead everywhere, the aim is met."""
    import json
    import shutil

    from results_check.page import check_page
    from results_check.pages import addition
    from rllib_p3o.sweep.grid import LR_FAMILY_REGIMES, family_key

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in (addition.BENCH_ADDITION_DEVELOPMENT, addition.BENCH_PROVENANCE_CONFIRMATION):
        shutil.copytree(os.path.join(root, folder), tmp_path / folder, ignore=shutil.ignore_patterns("prep"))
    methods = addition.DEVELOPMENT.methods
    choice = {
        "lr_peak": {family_key(m, f): 1.25e-4 for m in methods for f in LR_FAMILY_REGIMES},
        "families": {
            f: {"regime": r, "peaks": [1.25e-4, 2.5e-4], "scores": {m: {"0.000125": 0.9, "0.00025": 0.8} for m in methods}}
            for f, r in LR_FAMILY_REGIMES.items()
        },
    }  # fmt: skip
    (tmp_path / addition.BENCH_ADDITION_DEVELOPMENT / "lr_choice.json").write_text(json.dumps(choice))
    _addition_confirmation(tmp_path / addition.BENCH_ADDITION_CONFIRMATION, "four_steps_per_batch", "cispo")

    aim = addition.aim_verdict_quotes(str(tmp_path))
    assert aim[0].startswith("The aim on the confirmation set (") and aim[0].endswith(
        "is not met: it is best or tied in 10 of 11 regimes, ahead of every peer's default in 9 where the data drift "
        "(`async_staleness_8`, `offline_weaker`, `async_4_in_flight`, `async_staleness_4`, `async_staleness_4_inflight`, "
        "`offline_stale`, `two_steps_per_batch`, `behavior_weaker` and `temperature_1.2`), and 0 of its 33 seeds "
        "collapsed"
    )
    assert aim[1] == (
        "`four_steps_per_batch`: behind by 0.300, the regime's best `cispo`; the default trains at lr 0.000125, "
        "`cispo` at 0.00025"
    )
    assert f"| `four_steps_per_batch` | `{addition.DEFAULT_METHOD}` | 0.900 |" in aim[-2]
    assert aim[-1].startswith("| `four_steps_per_batch` | `cispo` | 0.600 |")
    addition.write_page(str(tmp_path))
    problems = check_page(addition.PAGE, str(tmp_path))
    assert problems == [], "\n".join(problems)
    text = (tmp_path / addition.PAGE.path).read_text()
    for section in ("## Learning rates", "## The confirmation set", "## The aim, and where it is missed"):
        assert section in text
    development = addition.load(str(tmp_path), addition.BENCH_ADDITION_DEVELOPMENT, addition.DEVELOPMENT)
    # The development set's section comes with its first finished regime (the committed set's state, whichever it is).
    assert ("## The development set\n" in text) == bool(addition.finished(development, addition.DEVELOPMENT))
    assert "- `four_steps_per_batch`: behind by 0.300" in text and "The confirmation set is complete." in text

    assert "cannot say which models it started from" in text  # the hand-made set has no prep folder

    shutil.rmtree(tmp_path / addition.BENCH_ADDITION_CONFIRMATION)
    _addition_confirmation(tmp_path / addition.BENCH_ADDITION_CONFIRMATION, "on_policy", addition.DEFAULT_METHOD)
    met = addition.aim_verdict_quotes(str(tmp_path))
    assert len(met) == 1 and " is met: it is best or tied in 11 of 11 regimes" in met[0]

    # Best or tied everywhere but ahead of the peers on-policy only: missed for too few regimes ahead where the data
    # drift, each of them named with the closest peer's default and the diagnostics.
    shutil.rmtree(tmp_path / addition.BENCH_ADDITION_CONFIRMATION)
    _addition_confirmation(tmp_path / addition.BENCH_ADDITION_CONFIRMATION, "on_policy", "cispo", others=0.8)
    tied = addition.aim_verdict_quotes(str(tmp_path))
    assert "is not met: it is best or tied in 11 of 11 regimes, ahead of every peer's default in 0 where" in tied[0]
    said = [q for q in tied[1:] if not q.startswith("|")]
    assert len(said) == 10 and said[0] == (
        "`async_staleness_8`: not ahead of `grpo_eps0.2` beyond the SE (+0.000, SE 0.008); the default trains at lr "
        "0.000125, `grpo_eps0.2` at 0.000125"
    )
    assert "| `async_staleness_8` | `grpo_eps0.2` | 0.800 |" in tied[-19]

    # The development set with a finished regime, the confirmation set's prep beside its own: both sections on a
    # page that passes its check, and whether the two sets started from the same models.
    dev = tmp_path / addition.BENCH_ADDITION_DEVELOPMENT
    summary = json.loads((dev / "summary.json").read_text())
    # The committed set's lr stages, with on-policy alone finished (whatever the committed set has run since).
    summary["summary"] = [r for r in summary["summary"] if r["stage"] not in addition.DEVELOPMENT.regimes] + [
        dict(stage="on_policy", method=m, heldout_at_budget_mean=0.9, heldout_at_budget_std=0.01, seeds=3, collapses=0)
        for m in methods
    ]
    (dev / "summary.json").write_text(json.dumps(summary))
    for folder in (addition.BENCH_ADDITION_DEVELOPMENT, addition.BENCH_ADDITION_CONFIRMATION):
        shutil.copytree(os.path.join(root, addition.BENCH_ADDITION_DEVELOPMENT, "prep"), tmp_path / folder / "prep")
    addition.write_page(str(tmp_path))
    problems = check_page(addition.PAGE, str(tmp_path))
    assert problems == [], "\n".join(problems)
    text = (tmp_path / addition.PAGE.path).read_text()
    assert (
        "## The development set\n" in text and "On the development set P3O's default is best or tied in 1 of 1" in text
    )
    assert "It started from the development set's base and weaker models (the same weight files, byte for byte)" in text
    with open(
        tmp_path / addition.BENCH_ADDITION_CONFIRMATION / "prep" / "weaker_model" / "model.safetensors", "ab"
    ) as f:
        f.write(b"\0")
    assert addition.same_models_quote(str(tmp_path)) == (
        "It started from other models than the development set's: `weaker_model` differs"
    )


def test_the_addition_pages_set_section_shows_its_finished_regimes_only(tmp_path):
    """A partial development set where on-policy has finished (every method, every seed) and the live weaker model
    has the default's rows only: the matrix holds on-policy alone, the rest are named as still running."""
    import json

    from results_check.pages import addition

    grid = addition.DEVELOPMENT
    rows = [dict(stage="on_policy", method=m, heldout_at_budget_mean=0.9, heldout_at_budget_std=0.01, seeds=3,
                 collapses=0) for m in grid.methods]  # fmt: skip
    rows.append(dict(rows[0], stage="behavior_weaker"))
    folder = tmp_path / addition.BENCH_ADDITION_DEVELOPMENT
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"note": "Partial: ...", "summary": rows}))
    quotes = addition.set_quotes(str(tmp_path), addition.BENCH_ADDITION_DEVELOPMENT, grid, "development")
    assert quotes[0] == "| method | `on_policy` |"
    assert "`on_policy` shows no difference between the methods" in quotes
    assert "Still running or to run: `async_staleness_4`, `offline_weaker` and `behavior_weaker`" in quotes
    assert (
        "On the development set P3O's default is best or tied in 1 of 1 finished regimes; ahead of every peer's "
        "default by more than the standard error in no regime; 0 of its 3 seeds collapsed"
    ) in quotes
    assert quotes[-1] == "The development set's files hold 0 distinct trials"
    (folder / "summary.json").write_text(json.dumps({"note": "Partial: ...", "summary": rows[:-2]}))  # one method short
    assert addition.set_quotes(str(tmp_path), addition.BENCH_ADDITION_DEVELOPMENT, grid, "development") == []


def test_a_later_lr_stage_says_where_p3os_default_stands_against_the_best_cell(tmp_path):
    """The stale-data lr stage on the addition page: the cells every seed has run, and the best peak of the trials P3O's
    default runs in there against the stage's best cell (the difference and its SE), "so far" until a later stage
    has a trial file."""
    import pandas as pd

    from results_check.pages import addition

    trials = tmp_path / addition.BENCH_ADDITION_DEVELOPMENT / addition.report.TRIALS_DIR
    stage = "lr_async_staleness_4"
    (trials / stage).mkdir(parents=True)
    twin = addition.DEVELOPMENT.same_run_as("async_staleness_4", addition.DEFAULT_METHOD)

    def trial(method, lr, seed, last):
        rows = [{"iteration": 1, "heldout": 0.3}, {"iteration": 30, "heldout": last}]
        frame = pd.DataFrame([{**r, "method": method, "lr_peak": lr, "seed": seed} for r in rows])
        frame.to_csv(trials / stage / f"{method}_seed{seed}_lr{lr}.csv", index=False)

    for seed, (low, high, best) in enumerate(((0.75, 0.90, 0.97), (0.77, 0.92, 0.96))):
        trial(twin, 0.000125, seed, low)
        trial(twin, 0.00025, seed, high)
        trial("cispo", 0.000125, seed, best)
    trial("cispo", 0.00025, 0, 0.99)  # one seed of two: not a cell, so not the best
    quotes = addition.other_stage_quotes(str(tmp_path), stage)
    assert quotes[0].startswith("The stage is still running: 3 cells have all 2 seeds")
    assert not any("0.990" in q for q in quotes)
    assert (
        f"P3O's default (`{addition.DEFAULT_METHOD}`) runs in the trials of `{twin}` in `async_staleness_4`" in quotes
    )
    assert quotes[-1] == "Its best peak so far is 0.00025: 0.910 ± 0.014, -0.055 to the best cell (SE 0.011)"
    (trials / "lr_offline_weaker").mkdir()
    (trials / "lr_offline_weaker" / "cispo_seed0_lr0.0005.csv").write_text(
        "iteration,heldout,method,lr_peak,seed\n1,0.3,cispo,0.0005,0\n"
    )
    quotes = addition.other_stage_quotes(str(tmp_path), stage)
    assert quotes[0] == "The stage has finished" and quotes[-1].startswith("Its best peak is 0.00025: ")
    assert addition.other_stage_quotes(str(tmp_path), "lr_offline_weaker") == []  # no complete cell


def test_the_addition_pages_diagnostics_give_the_trust_regions_band_where_it_acts():
    """The aim section's diagnostics give P3O's trust-region half-width ε = sqrt(1/ESS - 1) at the row's mean ESS,
    only where the method's ``ess_clip`` trust region acts in that regime (on the policy's own lagging rows)."""
    from results_check.pages.addition import CONFIRMATION
    from results_check.pages.staleness import band_at

    assert band_at(CONFIRMATION, "async_staleness_8", "p3o_other_alone", 0.998) == "0.045"
    assert band_at(CONFIRMATION, "async_staleness_4", "p3o_clip_version", 0.959) == "0.207"
    assert band_at(CONFIRMATION, "offline_stale", "p3o_other_alone", 1.0) == "0.000"
    # No lagging rows: on-policy, or another model's recording read as such; no trust region of P3O's: a peer's loss.
    assert band_at(CONFIRMATION, "on_policy", "p3o_other_alone", 0.998) == "–"
    assert band_at(CONFIRMATION, "offline_weaker", "p3o_other_alone", 0.9) == "–"
    assert band_at(CONFIRMATION, "async_staleness_8", "grpo_eps0.4", 0.998) == "–"
    assert band_at(CONFIRMATION, "async_staleness_8", "p3o_reference", 0.998) == "–"
