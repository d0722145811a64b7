"""The claims sweep (`rllib_p3o.sweep`): actor reuse in Tune (`P3O.reset_config`), the sweep through Tune with its
table, and its resume after the driver is killed. Real Ray, RLlib, Tune and vLLM on the tiny model."""

import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
from helpers import tiny_config

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.driver.trial_reuse import config_differences
from rllib_p3o.sweep import report
from rllib_p3o.sweep.grid import METHODS, lr_schedule
from rllib_p3o.sweep.run import stage_parallelism

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(model: str, **training) -> P3OConfig:
    return tiny_config(model, "rllib_p3o.tasks.arithmetic:arithmetic_reward", rows=40, **training)


def test_reuse_check_ignores_a_restored_experiments_lists_but_not_a_real_change(tiny_model):
    # A Tune restore hands back tuples (RLlib's `policies`) as lists: found in CI, where the restored sweep's
    # second trial could not reuse the actor.
    config = _config(tiny_model)
    as_restored = config.to_dict()
    as_restored["policies"] = {k: list(spec) for k, spec in as_restored["policies"].items()}
    restored = P3OConfig().update_from_dict(as_restored)
    # The value this test is about does change in the round trip (plain == would call it a difference).
    assert P3OConfig().update_from_dict(config.to_dict()).policies != restored.policies
    assert config_differences(config, restored) == []
    assert config_differences(config, _config(tiny_model, temperature=1.3, **METHODS["grpo_eps0.4"])) == ["temperature"]


@pytest.mark.slow
def test_reset_config_starts_the_next_trial_like_a_fresh_build(ray_session, tiny_model):
    first = _config(tiny_model).build_algo()
    try:
        first.train()
        second = _config(tiny_model, **METHODS["grpo_eps0.4"]).debugging(seed=1)
        assert first.reset_config(second.to_dict())
        first._iteration = 0  # Tune's `Trainable.reset` does this after reset_config
        reused = first.train()
        # A setting the runners depend on cannot change in a reused actor.
        assert not first.reset_config(_config(tiny_model, temperature=1.3).to_dict())
    finally:
        first.stop()
    fresh_algo = second.build_algo()
    try:
        fresh = fresh_algo.train()
    finally:
        fresh_algo.stop()
    assert reused[m.P3O][m.ACTOR_REUSED] == 1.0 and fresh[m.P3O][m.ACTOR_REUSED] == 0.0
    assert reused[m.P3O][m.SETUP_S] < fresh[m.P3O][m.SETUP_S]
    # The same weights, seeds and prompts as a fresh build: the same completions, rewards and first update.
    for key in (m.REWARD_MEAN, m.COMPLETION_LEN_MEAN, m.WEIGHTS_SEQ_NO):
        assert reused[m.P3O][key] == fresh[m.P3O][key], key
    assert reused["training_iteration"] == 1
    learner_r, learner_f = m.lookup(reused, *m.LEARNER), m.lookup(fresh, *m.LEARNER)
    assert learner_r[m.CLIP_FRACTION] == pytest.approx(learner_f[m.CLIP_FRACTION], abs=1e-6)
    assert learner_r[m.LOSS] == pytest.approx(learner_f[m.LOSS], rel=1e-4, abs=1e-6)


def _sweep_args(model: str, out: str):
    return [
        sys.executable,
        "-m",
        "rllib_p3o.cli",
        "sweep",
        "--out",
        out,
        "--base-model",
        model,
        "--regimes",
        "on_policy_4_steps",
        "temperature_1.2",
        "--methods",
        "p3o",
        "grpo_eps0.2",
        "--seeds",
        "0",
        "--iterations",
        "1",
        "--lr",
        "5e-4",
    ]


def _result_lines(path: str):
    with open(path) as f:
        return [json.loads(line)["training_iteration"] for line in f if line.strip()]


@pytest.mark.slow
def test_sweep_writes_its_table_and_a_restored_sweep_does_not_rerun_finished_trials(tiny_model, tmp_path):
    """Killed (SIGKILL) after its first stage, then interrupted (Ctrl-C) in its second, then run to the end."""
    out = str(tmp_path / "sweep")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    job = subprocess.Popen(_sweep_args(tiny_model, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 400
    # Kill the driver once the first regime's experiment is finished and the second one has begun.
    while time.time() < deadline and not os.path.isdir(os.path.join(out, "temperature_1.2")):
        assert job.poll() is None, job.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    job.send_signal(signal.SIGKILL)
    job.wait()
    first_stage = sorted(glob.glob(os.path.join(out, "on_policy_4_steps", "*", "result.json")))
    assert len(first_stage) == 2
    before = {p: (os.path.getmtime(p), _result_lines(p)) for p in first_stage}
    assert all(lines == [1] for _, lines in before.values())

    # Ctrl-C while the second stage runs: the sweep stops with 130 and says how to continue; it does not write a
    # report from part of the grid (it went on to the next stage before: Tune returns from fit() on a Ctrl-C).
    log = tmp_path / "interrupted.log"
    with open(log, "w") as f:
        job = subprocess.Popen(_sweep_args(tiny_model, out), env=env, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.time() + 400
        while time.time() < deadline and "[temperature_1.2] " not in log.read_text():
            assert job.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(3)
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=120) == 130, log.read_text()[-3000:]
    assert "rerun the same command to continue" in log.read_text()
    assert not os.path.exists(os.path.join(out, report.CURVES_CSV))
    assert len(report.read_trials(out, "temperature_1.2")) < 2  # (one row per trial of 1 iteration)

    done = subprocess.run(_sweep_args(tiny_model, out), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[on_policy_4_steps] finished earlier: 2 trials, not run again" in done.stdout
    assert {p: (os.path.getmtime(p), _result_lines(p)) for p in first_stage} == before  # not touched

    curves = pd.read_csv(os.path.join(out, report.CURVES_CSV))
    trials = curves.groupby([report.STAGE, report.METHOD]).size()
    assert trials.to_dict() == {
        (r, meth): 1 for r in ("on_policy_4_steps", "temperature_1.2") for meth in ("p3o", "grpo_eps0.2")
    }  # each trial trained its 1 iteration once
    table = open(os.path.join(out, report.SUMMARY_MD)).read()
    for regime in ("on_policy_4_steps", "temperature_1.2"):  # a row per method, and one in the regime × method matrix
        assert all(table.count(f"| {regime} | {method} |") == 1 for method in ("p3o", "grpo_eps0.2"))
        assert table.count(f"| {regime} |") == 3
    summary = json.load(open(os.path.join(out, report.SUMMARY_JSON)))
    assert summary["lr_peak"] == 5e-4 and len(summary["figures"]) == 2
    assert all(os.path.exists(os.path.join(out, f)) for f in summary["figures"])
    # The second trial of each experiment ran in the first one's actor.
    assert sorted(t[report.ACTOR_REUSED] for t in summary["trials"]) == [False, False, True, True]


@pytest.fixture(scope="module")
def tiny_sorting_model(tmp_path_factory):
    """An untrained tiny Qwen2 with the sorting task's tokenizer (no pretraining: the test is about the pipeline)."""
    from rllib_p3o.tasks import build_tiny_model
    from rllib_p3o.tasks.sorting import SortingTask

    return build_tiny_model(
        str(tmp_path_factory.mktemp("models") / "tiny_sorting"), SortingTask().corpus(), max_position_embeddings=64
    )


@pytest.mark.slow
def test_bench_quick_grid_chooses_an_lr_per_method_and_a_rerun_runs_only_missing_trials(tiny_sorting_model, tmp_path):
    # The claims bench's quick grid (`--task sorting --quick`), at 1 iteration per trial: the lr stage per method,
    # its trials reused as the on-policy stage's seeds, then the fp8-rollout stage.
    out = str(tmp_path / "bench")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    args = [sys.executable, "-m", "rllib_p3o.cli", "sweep", "--task", "sorting", "--quick", "--out", out]
    args += ["--base-model", tiny_sorting_model, "--iterations", "1"]
    # Its first run two trials at a time (`--parallel 2`), the rerun below one at a time.
    first = subprocess.run([*args, "--parallel", "2"], env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[lr_on_policy] 4 trials × 1 iterations, 2 at a time" in first.stdout
    choice = json.load(open(os.path.join(out, "lr_choice.json")))
    assert set(choice["lr_peak"]) == {"p3o_k3_is", "grpo_tis_eps0.2"}
    assert all(p in (5e-4, 1e-3) for p in choice["lr_peak"].values())
    curves = pd.read_csv(os.path.join(out, report.CURVES_CSV))
    per_stage = curves.groupby(report.STAGE).size().to_dict()
    assert per_stage == {"lr_on_policy": 4, "on_policy": 2, "fp8_rollouts": 2}  # 1 iteration per trial
    # The on-policy stage is the lr stage's trials at each method's chosen peak: not run twice.
    on_policy = curves[curves[report.STAGE] == "on_policy"]
    assert {(r[report.METHOD], r[report.LR_PEAK]) for _, r in on_policy.iterrows()} == set(choice["lr_peak"].items())
    assert not os.path.isdir(os.path.join(out, "on_policy"))
    assert curves[report.HELDOUT].notna().all()  # evaluated before the first update (sampled, avg@4)
    summary = json.load(open(os.path.join(out, report.SUMMARY_JSON)))
    assert "| p3o_k3_is |" in summary["lr_table"] and len(summary["figures"]) == 2

    # Resume from the trial files alone (as in a new session from a copy of <out>/trials): the Tune folders and one
    # trial's file gone, a rerun runs that one trial.
    for stage in ("lr_on_policy", "fp8_rollouts"):
        shutil.rmtree(os.path.join(out, stage))
    lost = sorted(glob.glob(os.path.join(out, report.TRIALS_DIR, "fp8_rollouts", "*.csv")))[0]
    os.remove(lost)
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[lr_on_policy] finished earlier: 4 trials, not run again" in again.stdout
    assert "[fp8_rollouts] continuing: 1 of 2 trials finished earlier are kept" in again.stdout
    assert os.path.exists(lost)
    assert len(glob.glob(os.path.join(out, "fp8_rollouts", "*", "result.json"))) == 1


def test_parallel_trials_share_the_cores_and_async_stages_run_alone(tiny_model, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    config = _config(tiny_model)
    assert stage_parallelism(config, 1) == (1, None)  # the config's own thread budget
    assert stage_parallelism(config, 2) == (2, 2)
    assert stage_parallelism(config, 8) == (8, 1)
    # An async trial's learner and runner already run side by side, a core each.
    assert stage_parallelism(_config(tiny_model, async_sampling=True), 2) == (1, None)


def test_lr_choice_is_the_peak_whose_worse_method_does_best():
    rows = []
    for peak, p3o, grpo in ((2e-4, 0.5, 0.4), (5e-4, 0.9, 0.6), (1e-3, 0.95, 0.3)):
        for method, last in (("p3o", p3o), ("grpo_eps0.2", grpo)):
            for it, value in ((1, 0.1), (2, last)):
                rows.append(
                    {
                        report.STAGE: "lr",
                        report.METHOD: method,
                        report.SEED: 0,
                        report.LR_PEAK: peak,
                        report.ITERATION: it,
                        report.SAMPLES: (it - 1) * 512,
                        report.HELDOUT: value,
                        report.ESS: 1.0,
                        report.SETUP_S: 1.0,
                        report.ACTOR_REUSED: 0.0,
                        report.ERROR: False,
                    }
                )
    choice = report.choose_lr(pd.DataFrame(rows), (2e-4, 5e-4, 1e-3))
    assert choice["lr_peak"] == 5e-4
    assert lr_schedule(5e-4) == [[0, 1e-5], [5120, 5e-4]]


def test_lr_choice_per_method_is_each_methods_best_peak():
    rows = []
    for regime, shift in (("lr_on_policy", 0.0), ("lr_bf16_rollouts", -0.05)):
        for peak, p3o, tis in ((2.5e-4, 0.5 + shift, 0.7), (5e-4, 0.9 + shift, 0.6), (1e-3, 0.8, 0.3 + shift)):
            for method, last in (("p3o", p3o), ("grpo_tis_eps0.2", tis)):
                for it, value in ((1, 0.1), (2, last)):
                    rows.append(
                        {
                            report.STAGE: regime,
                            report.METHOD: method,
                            report.SEED: 0,
                            report.LR_PEAK: peak,
                            report.ITERATION: it,
                            report.SAMPLES: (it - 1) * 512,
                            report.HELDOUT: value,
                            report.ESS: 1.0,
                            report.SETUP_S: 1.0,
                            report.ACTOR_REUSED: 0.0,
                            report.ERROR: False,
                        }
                    )
    curves = pd.DataFrame(rows)
    choice = report.choose_lr_per_method(curves, (2.5e-4, 5e-4, 1e-3), target=0.7)
    assert choice["lr_peak"] == {"p3o": 5e-4, "grpo_tis_eps0.2": 2.5e-4}
    table = report.lr_spread_table(curves, target=0.7)
    assert "| p3o | 0.900 (on_policy, 0.0005) | 0.450 (bf16_rollouts, 0.00025) | 0.450 |" in table


def _write_trial(out: str, stage: str, cell: tuple, last: float) -> None:
    """A finished trial's file as the sweep writes it (`report.write_trial`): held-out 0.3 at iteration 1, ``last`` at
    iteration 2."""
    rows = [
        {
            report.ITERATION: it,
            report.TIME_S: 10.0 * it,
            report.HELDOUT: value,
            report.ESS: 0.9,
            report.REWARD: value,
            report.SETUP_S: 1.0,
            report.ACTOR_REUSED: 0.0,
        }
        for it, value in ((1, 0.3), (2, last))
    ]
    report.write_trial(report.trial_path(out, stage, "{}_seed{}_lr{:g}".format(*cell)), stage, cell, rows, False, 512)


def test_report_only_reports_the_saved_trials_of_a_running_sweep_and_says_what_is_missing(tmp_path, capsys):
    # Trial files as a running claims-bench sweep leaves them (no Ray: the report reads files only).
    from rllib_p3o.sweep.grid import BENCH_QUICK, Grid
    from rllib_p3o.sweep.run import main

    methods = ("p3o", "grpo_tis_eps0.2", "grpo_tis_eps0.4")
    grid = Grid(**{**BENCH_QUICK.__dict__, "methods": methods, "lr_methods": methods, "iterations": 2})
    out = str(tmp_path / "bench")
    args = ["--task", "sorting", "--quick", "--out", out, "--report-only", "--iterations", "2"]
    args += ["--methods", *methods]
    scores = {("p3o", 5e-4): 0.6, ("p3o", 1e-3): 0.7, ("grpo_tis_eps0.2", 5e-4): 0.8}
    scores.update({("grpo_tis_eps0.2", 1e-3): 0.5, ("grpo_tis_eps0.4", 5e-4): 0.1, ("grpo_tis_eps0.4", 1e-3): 0.4})
    cells = sorted(scores)
    for method, peak in cells[:-1]:
        _write_trial(out, "lr_on_policy", (method, 0, peak), scores[method, peak])

    # The lr stage not finished: its table only, no peak chosen from part of it.
    assert main(args) == 0
    summary = json.load(open(os.path.join(out, report.SUMMARY_JSON)))
    assert summary["lr_peak"] is None and summary["summary"] == []
    missing = grid.num_trials() - 5
    assert summary["note"].startswith(f"Partial: 5 trials finished, {missing} not yet (the lr stage first")
    assert summary["note"] in capsys.readouterr().out
    assert not os.path.exists(os.path.join(out, report.CURVES_CSV))  # it stands for a finished sweep
    # A trial at a peak the stage added (its bracket extended) is finished too, though no bracket counted it.
    _write_trial(out, "lr_on_policy", ("p3o", 1, 2e-3), 0.2)
    assert main(args) == 0
    note = json.load(open(os.path.join(out, report.SUMMARY_JSON)))["note"]
    assert note.startswith(f"Partial: 6 trials finished (1 of them at peaks an lr stage added), {missing} not yet")
    os.remove(report.trial_path(out, "lr_on_policy", "p3o_seed1_lr0.002"))

    # The lr stage finished: each method's best peak; its trials there are the on-policy stage's seed 0.
    method, peak = cells[-1]
    _write_trial(out, "lr_on_policy", (method, 0, peak), scores[method, peak])
    assert main(args) == 0
    summary = json.load(open(os.path.join(out, report.SUMMARY_JSON)))
    assert summary["lr_peak"] == {"p3o": 1e-3, "grpo_tis_eps0.2": 5e-4, "grpo_tis_eps0.4": 1e-3}
    assert summary["note"].startswith("Partial: 6 trials finished, 3 not yet;")
    assert [(r["stage"], r["method"]) for r in summary["summary"]] == [("on_policy", m) for m in methods]
    assert [r["heldout_at_budget_mean"] for r in summary["summary"]] == [0.7, 0.8, 0.4]
    # A family of clip ranges gets a row over lr × ε, beside each method's over the lr.
    assert "| grpo_tis_eps0.4 | 0.400 (on_policy, 0.001) | 0.100 (on_policy, 0.0005) | 0.300 |" in summary["lr_table"]
    assert (
        "| grpo_tis (over ε too) | 0.800 (on_policy, 0.0005, ε 0.2) | 0.100 (on_policy, 0.0005, ε 0.4) | 0.700 |"
        in (summary["lr_table"])
    )

    # Every trial saved: the finished sweep's report, with curves.csv.
    for method, peak in summary["lr_peak"].items():
        _write_trial(out, "fp8_rollouts", (method, 0, peak), 0.5)
    assert main(args) == 0
    summary = json.load(open(os.path.join(out, report.SUMMARY_JSON)))
    assert summary["note"] is None and len(summary["summary"]) == 6 and len(summary["figures"]) == 2
    curves = pd.read_csv(os.path.join(out, report.CURVES_CSV))
    assert curves.groupby(report.STAGE).size().to_dict() == {"lr_on_policy": 12, "on_policy": 6, "fp8_rollouts": 6}
    # Paths relative to --out (a committed report stays true); the on-policy seeds are the lr stage's runs, counted once.
    assert summary["table"] == report.SUMMARY_MD
    assert summary["figures"] == [os.path.join(report.FIGURES, f"{r}.png") for r in ("on_policy", "fp8_rollouts")]
    assert summary["cost"]["trials"] == 9 and summary["cost"]["trial_time_s_sum"] == 9 * 20.0


def test_regime_matrix_puts_each_regime_on_a_row_bolds_its_best_and_counts_collapses():
    summary = pd.DataFrame(
        [
            {
                report.STAGE: regime,
                report.METHOD: method,
                "seeds": 3,
                "heldout_at_budget_mean": mean,
                "heldout_at_budget_std": 0.01,
                "collapses": collapses,
            }
            for regime, method, mean, collapses in (
                ("on_policy", "p3o", 0.7, 0),
                ("on_policy", "grpo_eps0.2", 0.8, 0),
                ("temperature_1.2", "p3o", 0.84, 0),
                ("temperature_1.2", "grpo_eps0.2", 0.66, 1),
            )
        ]
    )
    lines = report.regime_matrix(summary).splitlines()
    assert lines[0] == "| regime | p3o | grpo_eps0.2 |"
    assert lines[2] == "| on_policy | 0.700 ± 0.010 | **0.800 ± 0.010** |"
    assert lines[3] == "| temperature_1.2 | **0.840 ± 0.010** | 0.660 ± 0.010 (1/3 collapsed) |"


def test_sweep_compare_ignores_the_machines_columns_fails_on_a_training_value_and_sets_two_runs_side_by_side(
    tmp_path, capsys
):
    # `python -m rllib_p3o.sweep.compare`'s entry point, in process, on files the sweep's own writer wrote (it reads
    # files only); its exit status is what main returns.
    reference, rerun = str(tmp_path / "reference"), str(tmp_path / "rerun")
    for method in ("p3o", "cispo"):
        _write_trial(reference, "on_policy", (method, 0, 5e-4), 0.7)
    _write_trial(rerun, "on_policy", ("p3o", 0, 5e-4), 0.7)
    # Another machine: other wall and set-up times, the same training values.
    frame = pd.read_csv(report.trial_path(rerun, "on_policy", "p3o_seed0_lr0.0005"))
    frame[report.TIME_S] *= 3
    frame[report.SETUP_S] = 7.5
    frame.to_csv(report.trial_path(rerun, "on_policy", "p3o_seed0_lr0.0005"), index=False)

    def compare(*extra):
        from rllib_p3o.sweep.compare import main

        trials = [os.path.join(reference, "trials"), os.path.join(rerun, "trials")]
        status = main([*trials, *extra])
        return SimpleNamespace(returncode=status, stdout=capsys.readouterr().out, stderr="")

    done = compare("--json", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 trials found in both are identical (2 in the reference, 1 not in the rerun" in done.stdout
    assert json.load(open(tmp_path / "c.json"))["missing_from_rerun"] == ["on_policy/cispo_seed0_lr0.0005.csv"]
    # --complete: the missing trial fails the check.
    done = compare("--complete")
    assert done.returncode == 1 and "MISSING  on_policy/cispo_seed0_lr0.0005.csv" in done.stdout

    _write_trial(rerun, "on_policy", ("cispo", 0, 5e-4), 0.6875)  # one held-out value differs
    done = compare("--complete")
    assert done.returncode == 1
    assert "DIFFERS  on_policy/cispo_seed0_lr0.0005.csv: row 2 (iteration 2), heldout: 0.7 vs 0.6875" in done.stdout

    # --table: both runs' reports side by side, and whether P3O's place against the best other method is the same.
    def summary_row(stage, method, mean, collapses=0):
        keys = ("heldout_at_budget_mean", "heldout_at_budget_std", "collapses", "seeds")
        return {report.STAGE: stage, report.METHOD: method, **dict(zip(keys, (mean, 0.01, collapses, 3)))}

    for out, rows in (
        (reference, [summary_row("fp8", "p3o", 0.8), summary_row("fp8", "cispo", 0.7)]),
        (rerun, [summary_row("fp8", "p3o", 0.6, collapses=1), summary_row("fp8", "cispo", 0.75)]),
    ):
        with open(os.path.join(out, report.SUMMARY_JSON), "w") as f:
            json.dump({"summary": rows}, f)
    compare("--table", str(tmp_path / "side.md"))
    side = (tmp_path / "side.md").read_text()
    assert "| fp8 | p3o | **0.800 ± 0.010** | 0.600 ± 0.010 (1/3 collapsed) | -0.200 |" in side
    assert "| fp8 | cispo | 0.700 ± 0.010 | **0.750 ± 0.010** | +0.050 |" in side
    assert "| fp8 | +0.100 | -0.150 | no |" in side


def test_regime_methods_run_only_in_their_regimes_at_their_twins_lr():
    from rllib_p3o.sweep.grid import BENCH_FULL, Grid
    from rllib_p3o.sweep.run import regime_frames

    grid = Grid(
        regimes=("on_policy", "behavior_weaker"),
        methods=("p3o_k3", "cispo"),
        seeds=(0,),
        iterations=2,
        regime_methods={"behavior_weaker": ("p3o_k3_src",)},
    )
    assert grid.methods_in("on_policy") == ("p3o_k3", "cispo")
    assert grid.methods_in("behavior_weaker") == ("p3o_k3", "cispo", "p3o_k3_src")
    assert grid.all_methods() == ("p3o_k3", "cispo", "p3o_k3_src") and grid.num_trials() == 5
    asked = {}

    def stage_rows(name, cells):  # runs nothing: the test is about which cells are asked for
        asked[name] = cells
        return pd.DataFrame()

    regime_frames(grid, {"p3o_k3": 2.5e-4, "cispo": 5e-4}, pd.DataFrame(), stage_rows)
    assert asked["on_policy"] == [("p3o_k3", 0, 2.5e-4), ("cispo", 0, 5e-4)]
    assert asked["behavior_weaker"][-1] == ("p3o_k3_src", 0, 2.5e-4)  # the lr its batch-scoped twin chose
    # The bench: one optimizer step per batch is the primary protocol; two steps are a regime of their own.
    assert "two_steps_per_batch" in BENCH_FULL.regimes and BENCH_FULL.regimes[:2] == ("on_policy", "behavior_weaker")
    # 66 lr trials; 9 regimes × 11 methods × 3 seeds, less the 11 × 2 on-policy seeds the lr stage ran; the ESS per
    # source variants in the two behavior-model regimes (3 × 2 × 3); P3O's defaults in every regime (9 × 3).
    assert BENCH_FULL.num_trials() == 66 + 9 * 11 * 3 - 22 + 18 + 27 == 386
    assert all(BENCH_FULL.methods_in(r)[-1] == "p3o_default" for r in BENCH_FULL.regimes)


def test_verdicts_follow_the_one_tie_rule_and_name_p3os_standing_in_each_regime():
    rows = [
        ("on_policy", "p3o_k3_is", 0.84, 0.02, 0),
        ("on_policy", "grpo_tis_eps0.2", 0.85, 0.01, 0),
        ("on_policy", "cispo", 0.70, 0.01, 0),
        ("behavior_weaker", "p3o_k3", 0.29, 0.05, 2),
        ("behavior_weaker", "p3o_k3_is", 0.80, 0.01, 0),
        ("behavior_weaker", "grpo_tis_eps0.2", 0.75, 0.03, 0),
    ]
    summary = pd.DataFrame(
        [
            {
                report.STAGE: regime,
                report.METHOD: method,
                "seeds": 3,
                "heldout_at_budget_mean": mean,
                "heldout_at_budget_std": std,
                "collapses": collapses,
            }
            for regime, method, mean, std, collapses in rows
        ]
    )
    words = {v["regime"]: v for v in report.regime_verdicts(summary)}
    # 0.84 vs 0.85 within the larger std (0.02): a tie, and both bold; cispo is 0.15 below: neither.
    assert words["on_policy"]["best_or_tied"] == ["p3o_k3_is", "grpo_tis_eps0.2"]
    assert words["on_policy"]["focus"]["p3o_k3_is"]["verdict"] == "ties"
    weaker = words["behavior_weaker"]
    assert weaker["best_or_tied"] == ["p3o_k3_is"]
    assert weaker["focus"]["p3o_k3_is"] == {"verdict": "wins", "against": "grpo_tis_eps0.2", "gap": pytest.approx(0.05)}
    # Each P3O variant is measured against the best baseline, never against another P3O variant.
    assert weaker["focus"]["p3o_k3"] == {"verdict": "loses", "against": "grpo_tis_eps0.2", "gap": pytest.approx(-0.46)}
    assert weaker["collapses"] == {"p3o_k3": "2/3"}
    text = report.verdict_sentences(report.regime_verdicts(summary), summary)
    assert (
        "`p3o_k3` loses to `grpo_tis_eps0.2` (-0.460; 2/3 collapsed). `p3o_k3_is` wins over `grpo_tis_eps0.2` (+0.050)."
        in text
    )
    assert "| on_policy | **0.840 ± 0.020** | **0.850 ± 0.010** | 0.700 ± 0.010 |" in report.regime_matrix(summary)


def test_the_committed_claims_report_is_what_the_report_reads_from_its_trials(tmp_path):
    """results/bench/summary.json (which docs/results/claims.md is checked against) is the report the sweep writes
    from the committed trial files: every summary row and every verdict sentence, so neither can drift."""
    import json
    import shutil

    from rllib_p3o.sweep import run

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "bench")
    out = tmp_path / "bench"
    shutil.copytree(os.path.join(root, "trials"), out / "trials")
    shutil.copy(os.path.join(root, "lr_choice.json"), out / "lr_choice.json")
    assert run.main(["--task", "sorting", "--full", "--out", str(out), "--report-only"]) == 0
    with open(os.path.join(root, "summary.json")) as f:
        committed = json.load(f)
    with open(out / "summary.json") as f:
        derived = json.load(f)
    assert not derived["note"] and not committed["note"]  # the whole grid: nothing missing
    assert derived["verdict_sentences"] == committed["verdict_sentences"]
    pd.testing.assert_frame_equal(pd.DataFrame(derived["summary"]), pd.DataFrame(committed["summary"]))


def test_lr_flag_sets_every_methods_rate_even_where_the_grid_reads_a_committed_choice():
    """``--lr`` on a confirmation set (whose rates come from a committed lr_choice.json) runs every method at it."""
    from rllib_p3o.sweep.run import _grid, _parser

    args = ["--task", "sorting", "--confirmation", "--regimes", "four_steps_per_batch", "--methods", "p3o_clip_version"]
    chosen = _grid(_parser().parse_args(args))
    assert chosen.lr_choice_from
    grid = _grid(_parser().parse_args([*args, "--lr", "0.00025"]))
    assert (grid.lr_choice_from, grid.lr_per_family, grid.lr_peaks, grid.default_lr) == (None, False, (), 0.00025)


def test_a_set_whose_lr_choice_is_not_committed_stops_before_ray_and_says_what_to_run(monkeypatch, tmp_path, capsys):
    """A confirmation set reads its rates from its development set's lr_choice.json. Without that file the sweep
    exits 2 at once, naming the file and the command that writes it, before Ray starts or a model is prepared (Ray
    is stubbed to fail the test if it is reached: the part this test is not about)."""
    import ray

    from rllib_p3o.sweep import run as sweep_run

    grid = sweep_run.GRIDS["addition", "confirmation"]
    missing = type(grid)(**{**grid.__dict__, "lr_choice_from": "results/no-such-set/lr_choice.json"})
    monkeypatch.setitem(sweep_run.GRIDS, ("addition", "confirmation"), missing)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    assert sweep_run.main(["--task", "addition", "--confirmation", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "results/no-such-set/lr_choice.json" in err and "--development" in err and "--lr" in err
    assert not os.path.exists(tmp_path / "out" / "prep")


def test_a_confirmation_set_starts_from_its_development_sets_committed_models(monkeypatch, tmp_path):
    """The addition confirmation set trains the base and weaker models its lr choice was made on: copied from the
    development set's committed prep folder into its own, not built again (another CPU builds other ones). Building
    is stubbed to fail the test (the part this test is not about); without the folder the set builds its models."""
    from rllib_p3o.sweep import grid as sweep_grid
    from rllib_p3o.sweep.prep import prepare

    confirmation = sweep_grid.GRIDS["addition", "confirmation"]
    committed = sweep_grid.repository_path(confirmation.models_from)
    assert confirmation.models_from == "results/bench-addition-development/prep"
    assert os.path.isdir(os.path.join(committed, "base_model")) and os.path.isdir(
        os.path.join(committed, "weaker_model")
    )
    task = sweep_grid.TASKS["addition"]
    monkeypatch.setitem(
        sweep_grid.TASKS,
        "addition",
        dataclasses.replace(task, build_model=lambda *a, **k: pytest.fail("a model was built")),
    )
    out = tmp_path / "confirmation"
    messages = []
    prepared = prepare(str(out), confirmation, {"weaker_model"}, say=messages.append)
    for key in ("base_model", "weaker_model"):
        path = getattr(prepared, key)
        assert path == str(out / "prep" / key)
        with (
            open(os.path.join(path, "model.safetensors"), "rb") as a,
            open(os.path.join(committed, key, "model.safetensors"), "rb") as b,
        ):
            assert a.read() == b.read()
    assert sum("the committed one" in m for m in messages) == 2
    again = []
    assert prepare(str(out), confirmation, {"weaker_model"}, say=again.append) == prepared
    assert not any("the committed one" in m for m in again)  # copied once
    with open(out / "prep" / "weaker_model" / "model.safetensors", "ab") as f:
        f.write(b"\0")  # a model of another run in the set's folder is refused, not taken for the committed one
    with pytest.raises(ValueError, match="weaker_model is not the model committed in .*--fresh"):
        prepare(str(out), confirmation, {"weaker_model"}, say=again.append)

    built = []
    monkeypatch.setitem(
        sweep_grid.TASKS,
        "addition",
        dataclasses.replace(task, build_model=lambda path, **k: built.append(path) or path),
    )
    absent = type(confirmation)(**{**confirmation.__dict__, "models_from": str(tmp_path / "no-such-prep")})
    prepare(str(tmp_path / "elsewhere"), absent, {"weaker_model"}, say=messages.append)
    assert [os.path.basename(p) for p in built] == ["base_model", "weaker_model"]
    assert any("not found: building the models" in m for m in messages)
    # A base model of the user's own (--base-model): nothing committed is copied, its weaker model is built.
    own = prepare(str(tmp_path / "own"), confirmation, {"weaker_model"}, base_model="my-model", say=messages.append)
    assert own.base_model == "my-model" and not os.path.exists(tmp_path / "own" / "prep" / "base_model")
    assert os.path.basename(built[-1]) == "weaker_model" and len(built) == 3


def test_a_set_records_the_seeds_it_trains_and_no_others(monkeypatch, tmp_path):
    """Each seed's recordings (`Grid.recording_per_seed`): the addition development set records seeds 0-2 (its lr
    stage's and its own), its confirmation set seeds 3-5 only, not seed 0 nor its lr stage's default seeds. Recording
    and building are stubbed (they run vLLM and pretraining: not what this test is about) and write empty folders."""
    from rllib_p3o.sweep import grid as sweep_grid
    from rllib_p3o.sweep import prep

    recorded = []

    def record(task, model, path, grid, seed=0):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "rows.parquet"), "w").close()
        recorded.append((os.path.basename(os.path.dirname(path)), seed, os.path.basename(model)))
        return path

    monkeypatch.setattr(prep, "_record", record)
    task = sweep_grid.TASKS["addition"]
    monkeypatch.setitem(
        sweep_grid.TASKS,
        "addition",
        dataclasses.replace(task, build_model=lambda path, **k: os.makedirs(path, exist_ok=True) or path),
    )
    needs = {"weaker_model", "stale_recording", "weaker_recording"}
    for name, seeds in (("development", [0, 1, 2]), ("confirmation", [3, 4, 5])):
        recorded.clear()
        grid = sweep_grid.GRIDS["addition", name]
        grid = type(grid)(**{**grid.__dict__, "models_from": None})  # the models are built (stubbed) here
        prepared = prep.prepare(str(tmp_path / name), grid, needs, say=lambda _: None)
        inputs = sweep_grid.seed_inputs(sweep_grid.REGIMES["offline_weaker"], prepared, grid)
        assert sorted(inputs) == seeds and all(os.path.isdir(p) for ps in inputs.values() for p in ps)  # recorded
        assert sorted(recorded) == sorted(
            (folder, s, model)
            for folder, model in (("stale_recording", "base_model"), ("weaker_recording", "weaker_model"))
            for s in seeds
        ), name
        prep.prepare(str(tmp_path / name), grid, needs, say=lambda _: None)
        assert len(recorded) == 6  # nothing recorded again on a rerun


def test_each_trial_file_names_the_cpu_it_ran_on_and_the_page_says_which(tmp_path):
    """A set resumed on another CPU differs in every float; its trial files say which CPU each trial ran on, and a
    results page's machine line comes from them (files from before the column: the CPU the pages named then)."""
    import numpy as np

    from results_check.pages._fmt import EARLIER_CPU, machine_words, trial_cpus
    from rllib_p3o.sweep.machine import cpu_description, describe_cpu

    assert describe_cpu("AMD EPYC", ["sse2", "avx2", "avx512f"]) == "AMD EPYC with AVX-512"
    assert describe_cpu("AMD EPYC", ["sse2", "avx2"]) == "AMD EPYC with AVX2"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    assert cpu_description(str(cpuinfo)) == "AMD EPYC with AVX2"

    path = report.trial_path(str(tmp_path), "on_policy", "p3o_seed0_lr0.001")
    report.write_trial(path, "on_policy", ("p3o", 0, 1e-3), [{report.ITERATION: 1, report.HELDOUT: 0.5}], False, 512)
    written = report.read_trials(str(tmp_path))
    assert list(written[report.MACHINE]) == [cpu_description()]

    assert trial_cpus(pd.DataFrame({report.HELDOUT: [0.5]})) == [EARLIER_CPU]
    mixed = pd.DataFrame({report.MACHINE: ["AMD EPYC with AVX2", np.nan]})
    assert trial_cpus(mixed) == ["AMD EPYC with AVX-512", "AMD EPYC with AVX2"]
    assert machine_words(trial_cpus(mixed)) == (
        "**Machine:** 2-core x86-64 CPUs (trials on AMD EPYC with AVX-512 and AMD EPYC with AVX2)"
    )


def test_the_report_counts_a_trial_two_methods_share_once(tmp_path):
    # On-policy, the addition set's P3O forms and GRPO's clip ranges compute the same update: one trial each group,
    # reported under every method's name. The cost counts the trials run (one file each), not the cells.
    from rllib_p3o.sweep.grid import GRIDS, Grid, method_peak, read_lr_peaks
    from rllib_p3o.sweep.run import report_saved

    confirmation = GRIDS["addition", "confirmation"]
    grid = Grid(**{**confirmation.__dict__, "regimes": ("on_policy",), "seeds": (3,), "iterations": 2})
    runs = grid.runs_in("on_policy")
    assert len(runs) < len(grid.methods_in("on_policy"))  # some methods share a trial
    peaks = read_lr_peaks(grid.lr_choice_from)
    out = str(tmp_path / "set")
    for method in runs:
        _write_trial(out, "on_policy", (method, 3, method_peak(peaks, method, "on_policy")), 0.9)
    summary = report_saved(out, grid)
    assert len(summary["summary"]) == len(grid.methods_in("on_policy"))  # every method has its row
    assert summary["cost"] == {"trial_time_s_sum": 20.0 * len(runs), "timed_trials": len(runs), "trials": len(runs)}
    assert summary["startup"]["fresh_trials"] == len(runs)


def test_every_committed_sets_cost_counts_each_of_its_trial_files_once():
    # One file per trial run (a trial several methods share has one file): the committed reports' cost says as many.
    from rllib_p3o.sweep.grid import repository_path

    sets = [os.path.dirname(p) for p in glob.glob(os.path.join(repository_path("results"), "bench*", "summary.json"))]
    checked = 0
    for folder in sets:
        files = glob.glob(os.path.join(folder, report.TRIALS_DIR, "*", "*.csv"))
        if not files:  # a set committed without its trial files
            continue
        cost = json.load(open(os.path.join(folder, report.SUMMARY_JSON)))["cost"]
        assert cost["trials"] == len(files), folder
        checked += 1
    assert checked >= 10
