"""Fault injection: a runner killed, the driver killed, a NaN in a learner batch; what each costs.

    python benchmarks/faults.py [--out results/benchmarks/faults.json]

Each scenario trains the tiny test model (arithmetic prompts, 4 prompts x 4 completions per iteration, every
sampled batch recorded as trajectory Parquet) and reports:
- iterations_lost / iterations_duplicated: iterations missing from / counted twice in the results (a train() that
  raised; for the driver kill, Tune's result.json of the whole run, killed and restored);
- iterations_redone (driver kill): iterations that had started (sampled and recorded) but were neither in Tune's
  results nor in a checkpoint when the driver died: their work is lost and the restored run trains them again;
- seconds_to_recover: runner kill: from the kill until the restarted runner holds the current, verified weights;
  driver kill: from the start of `Tuner.restore` to its first new result;
- prompts_replayed / prompts_skipped: prompt groups trained more than once / never, over the whole run, from the
  recorded group ids (each group id is one prompt of the schedule);
- the NaN scenario also reports the skipped steps and whether the weights stayed unchanged by the poisoned step.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq
from _report import write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(model: str, record_dir: str, num_env_runners: int):
    from rllib_p3o.tasks.scenarios import tiny_run

    def starts_with_digit(prompts, completions, **_):
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    config = tiny_run(
        model,
        starts_with_digit,
        rows=40,
        prompts_per_step=4,
        num_env_runners=num_env_runners,
        record_rollouts=record_dir,
    )
    return config.fault_tolerance(restart_failed_env_runners=True)


def _prompt_accounting(record_dir: str, group_size: int = 4) -> dict:
    files = sorted(glob.glob(os.path.join(record_dir, "part-*.parquet")))
    counts = collections.Counter(
        int(g) for f in files for g in pq.read_table(f, columns=["group_id"]).column("group_id").to_pylist()
    )
    times = collections.Counter(c // group_size for c in counts.values())
    expected = set(range(max(counts) + 1)) if counts else set()
    return {
        "iterations_recorded": len(files),
        "prompts": len(counts),
        "prompts_replayed": sum(n for k, n in times.items() if k > 1),
        "prompts_skipped": len(expected - set(counts)),
    }


def runner_kill(model: str, work: str) -> dict:
    import ray

    from rllib_p3o.core import metrics as m

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    rec = os.path.join(work, "runner_kill")
    algo = _config(model, rec, num_env_runners=2).build_algo()
    lost, recover_s, restarted_at = 0, None, None
    try:
        for _ in range(3):
            algo.train()
        pid = algo.env_runner_group.foreach_env_runner(
            lambda r: os.getpid(), remote_worker_ids=[1], local_env_runner=False
        )[0]
        os.kill(pid, signal.SIGKILL)
        t_kill = time.perf_counter()
        samples_lost = 0
        while algo.iteration < 200:
            try:
                res = algo.train()
            except Exception as e:  # noqa: BLE001 - counted: an iteration lost
                print(f"train() raised: {e}", flush=True)
                lost += 1
                continue
            samples_lost = max(samples_lost, res[m.P3O][m.SAMPLES_LOST_LIFETIME])
            if recover_s is None and res[m.P3O][m.ENV_RUNNER_RESTARTS_LIFETIME] >= 1:
                recover_s, restarted_at = time.perf_counter() - t_kill, int(algo.iteration)
            if restarted_at is not None and algo.iteration >= restarted_at + 3:
                break
        healthy = res[m.P3O][m.HEALTHY_ENV_RUNNERS]
        iterations = int(algo.iteration)
    finally:
        algo.stop()
        ray.shutdown()
    return {
        "iterations": iterations,
        "iterations_lost": lost,
        "iterations_duplicated": 0,
        "seconds_to_recover": recover_s,
        "iterations_until_restarted": restarted_at and restarted_at - 3,
        "samples_lost_and_resampled": samples_lost,
        "healthy_runners_at_end": healthy,
        **_prompt_accounting(rec),
    }


def driver_kill(model: str, work: str, iterations: int = 10, kill_after: int = 5) -> dict:
    storage, rec = os.path.join(work, "tune"), os.path.join(work, "driver_kill")
    script = os.path.join(ROOT, "tests", "fixtures", "tune_job.py")  # the Tune job the fault tests kill too
    args = [sys.executable, script, model, storage, rec, str(iterations)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    job = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while len(glob.glob(os.path.join(rec, "part-*.parquet"))) < kill_after:
        if job.poll() is not None:
            raise RuntimeError("the Tune job ended before it could be killed")
        time.sleep(0.1)
    job.send_signal(signal.SIGKILL)
    job.wait()
    parts_at_kill = len(glob.glob(os.path.join(rec, "part-*.parquet")))
    trial = glob.glob(os.path.join(storage, "faults", "P3O_*"))[0]
    with open(os.path.join(trial, "result.json")) as f:
        before = [json.loads(line)["training_iteration"] for line in f if line.strip()]
    t0 = time.time()
    from rllib_p3o.driver.experiment_state import check_experiment_state

    # As `rllib-p3o train --resume` does: a kill inside Tune's rewrite of its state leaves it unreadable.
    check_experiment_state(os.path.join(storage, "faults"), repair=True)
    done = subprocess.run(args + ["--restore"], env=env, capture_output=True, text=True)
    if f"DONE {iterations}" not in done.stdout:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    with open(os.path.join(trial, "result.json")) as f:
        results = [json.loads(line) for line in f if line.strip()]
    its = [r["training_iteration"] for r in results]
    first_new = min(r["timestamp"] for r in results[len(before) :]) if len(results) > len(before) else None
    return {
        "iterations": iterations,
        "killed_while_in_iteration": len(before) + 1,
        "iterations_redone": parts_at_kill - len(before),
        "iterations_lost": len(set(range(1, iterations + 1)) - set(its)),
        "iterations_duplicated": len(its) - len(set(its)),
        "seconds_to_recover": first_new - t0 if first_new else None,
        "restore_command_s": time.time() - t0,
        **_prompt_accounting(rec),
    }


def nan_injection(model: str, work: str) -> dict:
    import ray
    import torch

    from rllib_p3o.core import metrics as m
    from rllib_p3o.core.columns import Columns

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    rec = os.path.join(work, "nan")
    algo = _config(model, rec, num_env_runners=1).build_algo()

    def weights():
        state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"]
        return {k: torch.as_tensor(v).clone() for k, v in state["default_policy"].items()}

    try:
        for _ in range(3):
            algo.train()
        update = algo._update

        def poisoned_update(batch):  # one iteration's batch gets a NaN advantage
            batch[Columns.ADVANTAGES] = batch[Columns.ADVANTAGES].copy()
            batch[Columns.ADVANTAGES][0] = np.nan
            return update(batch)

        before = weights()
        algo._update = poisoned_update
        res = algo.train()
        algo._update = update
        unchanged = all(torch.equal(before[k], v) for k, v in weights().items())
        skipped = res[m.P3O][m.SKIPPED_NONFINITE_STEPS]
        lost = 0
        for _ in range(3):
            res = algo.train()
        finite = bool(np.isfinite(res[m.P3O][m.REWARD_MEAN])) and all(
            bool(torch.isfinite(v).all()) for v in weights().values()
        )
        iterations = int(algo.iteration)
    finally:
        algo.stop()
        ray.shutdown()
    return {
        "iterations": iterations,
        "iterations_lost": lost,
        "iterations_duplicated": 0,
        "skipped_nonfinite_steps": skipped,
        "weights_unchanged_by_poisoned_step": unchanged,
        "training_finite_afterwards": finite,
        "seconds_to_recover": 0.0,
        **_prompt_accounting(rec),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/benchmarks/faults.json")
    args = parser.parse_args()
    from rllib_p3o.tasks import build_tiny_model

    work = tempfile.mkdtemp(prefix="p3o_faults_")
    model = build_tiny_model(os.path.join(work, "model"))
    report = {"setting": "tiny Qwen2, 40 arithmetic prompts, 4 prompts x 4 completions per iteration, 2 CPU cores"}
    scenarios = {"runner_kill": runner_kill, "driver_kill": driver_kill, "nan_injection": nan_injection}
    for name, scenario in scenarios.items():
        print(f"[{name}] ...", flush=True)
        t0 = time.perf_counter()
        report[name] = scenario(model, work)
        report[name]["scenario_s"] = time.perf_counter() - t0
        print(f"[{name}] {report[name]}", flush=True)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
