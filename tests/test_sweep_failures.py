"""The sweep's infrastructure failures (`rllib_p3o.sweep.failures`): an actor lost mid-trial is retried and recorded
apart, never written as the method's errored (collapsed) trial; a training failure still is. The classification on
Ray's real exception types; the retry through a real Tune stage whose trial actor is killed (real Ray, RLlib, Tune,
vLLM, tiny model)."""

import json
import os

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError

from rllib_p3o.learner.p3o_torch_learner import NonFiniteStepError
from rllib_p3o.sweep import failures, report
from rllib_p3o.sweep import run as sweep_run


def _task_error(cause: BaseException) -> RayTaskError:
    return RayTaskError("P3O.train", "Traceback ...", cause)


def test_infrastructure_failures_are_told_from_training_failures():
    assert failures.is_infrastructure_failure(ActorDiedError())
    assert failures.is_infrastructure_failure(GetTimeoutError("timed out"))
    assert failures.is_infrastructure_failure(_task_error(ActorDiedError()))  # a runner lost inside the trial
    assert failures.is_infrastructure_failure("RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234")
    assert not failures.is_infrastructure_failure(_task_error(NonFiniteStepError("3 steps skipped")))
    assert not failures.is_infrastructure_failure(ValueError("bad config"))
    assert not failures.is_infrastructure_failure(None)
    # A runner alive but late on a busy machine (seen in a development grid beside a test run): retried, not a collapse.
    late = RuntimeError("EnvRunner 1 did not return its 64 prompt groups within sample_timeout_s=60.0.")
    assert failures.is_infrastructure_failure(_task_error(late))
    assert not failures.is_infrastructure_failure(RuntimeError("async sampling produced no usable samples"))
    assert failures.summary_line("Traceback\n  ...\nActorDiedError: gone\n") == "ActorDiedError: gone"


def test_a_killed_trial_actor_is_run_again_and_recorded_apart_not_as_a_collapse(
    tiny_model, tmp_path, monkeypatch, ray_session
):
    from test_sweep import _config

    out = str(tmp_path / "sweep")
    os.makedirs(out)
    killed = []
    keep = sweep_run.StageProgress.on_trial_result

    def kill_once(self, iteration, trials, trial, result, **info):
        keep(self, iteration, trials, trial, result, **info)
        if not killed:  # the first trial's actor dies after its first iteration, as a lost node would take it
            killed.append(trial.trial_id)
            ray.kill(trial.temporary_state.ray_actor, no_restart=True)

    monkeypatch.setattr(sweep_run.StageProgress, "on_trial_result", kill_once)
    cells = [("p3o", 0, 5e-4)]
    rows = sweep_run.run_stage(out, "on_policy", _config(tiny_model), cells, iterations=2)
    assert killed and len(rows) == 2 and not rows[report.ERROR].any()  # run again to the end, not an errored trial
    recorded = failures.recorded(out)
    assert [(r["stage"], r["trial"], r["attempt"]) for r in recorded] == [("on_policy", "p3o_seed0_lr0.0005", 0)]
    assert "Actor" in recorded[0]["error"] or "actor" in recorded[0]["error"]
    with open(os.path.join(out, failures.INFRA_FAILURES)) as f:
        assert json.loads(f.readline())["trial"] == "p3o_seed0_lr0.0005"
