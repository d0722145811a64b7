"""A README-style Tune run of P3O for tests/test_mistakes.py: a script of its own, so that the test sees its screen and
its exit status as a person would.

    python tests/readme_style_job.py MODEL STORAGE ITERATIONS [--fail-at N] [--no-checkpoints] [--retries K]
        [--restore] [--lr LR]

``--fail-at N``: the reward function raises in iteration N (once: a flag file written by a callback arms it, and the
failure disarms it). ``--retries K``: Tune's FailureConfig(max_failures=K). ``--restore``: continue the experiment
with ``tune.Tuner.restore(..., resume_errored=True)``. Exits 1 when a trial failed, as the README shows.
"""

import argparse
import os

import ray
from ray import tune

import rllib_p3o  # noqa: F401  (registers "P3O" with Tune)
from rllib_p3o.driver.progress import IterationPrinter
from rllib_p3o.tasks.scenarios import tiny_run

NAME = "readme_style"


class ArmFailure(tune.Callback):
    """Writes the flag file after iteration ``at - 1``'s result: the reward function then fails in iteration ``at``."""

    def __init__(self, flag: str, at: int):
        self.flag, self.at = flag, at

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == self.at - 1 and not os.path.exists(self.flag + ".done"):
            open(self.flag, "w").close()


def make_reward(flag: str):
    def reward(prompts, completions, answer, **_):
        if os.path.exists(flag):
            os.replace(flag, flag + ".done")  # once
            raise RuntimeError("deliberate failure of the test's reward function")
        return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]

    return reward


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("storage")
    parser.add_argument("iterations", type=int)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--no-checkpoints", action="store_true")
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    flag = os.path.join(args.storage, "fail.flag")
    os.makedirs(args.storage, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False)
    if args.restore:
        tuner = tune.Tuner.restore(os.path.join(args.storage, NAME), trainable="P3O", resume_errored=True)
    else:
        config = tiny_run(args.model, make_reward(flag), rows=64, prompts_per_step=4, lr=args.lr)
        checkpoints = (
            tune.CheckpointConfig()
            if args.no_checkpoints
            else tune.CheckpointConfig(checkpoint_frequency=1, checkpoint_at_end=True)
        )
        callbacks = [IterationPrinter()] + ([ArmFailure(flag, args.fail_at)] if args.fail_at else [])
        tuner = tune.Tuner(
            "P3O",
            param_space=config,
            run_config=tune.RunConfig(
                name=NAME,
                storage_path=args.storage,
                stop={"training_iteration": args.iterations},
                checkpoint_config=checkpoints,
                failure_config=tune.FailureConfig(max_failures=args.retries),
                callbacks=callbacks,
                verbose=0,
            ),
        )
    results = tuner.fit()
    if results.errors:
        raise SystemExit(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
