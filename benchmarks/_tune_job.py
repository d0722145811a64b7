"""A Tune run of P3O that `benchmarks/faults.py` and tests/test_faults.py kill with SIGKILL and continue with
`tune.Tuner.restore` (a script: the driver must be a process of its own to be killed).

    python benchmarks/_tune_job.py MODEL STORAGE RECORD_DIR ITERATIONS [--restore]
"""

import os
import sys

import ray
from ray import tune

import rllib_p3o  # noqa: F401  (registers "P3O" with Tune)
from rllib_p3o import P3OConfig
from rllib_p3o.tasks import ArithmeticTask

NAME = "faults"


def main() -> None:
    model, storage, record_dir, iterations = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    # Tune saves its experiment state (which checkpoint is a trial's latest) at most every 10 s by default. A driver
    # killed in between leaves a state that names an older checkpoint: the restore trains its later iterations again
    # (counted twice in result.json), or, once `num_to_keep` has deleted that checkpoint, fails. Saved after every
    # result, the state names the newest checkpoint, or the one before it (still kept) while a save is registered.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    if "--restore" in sys.argv:
        tuner = tune.Tuner.restore(f"{storage}/{NAME}", trainable="P3O", resume_errored=True)
    else:
        config = (
            P3OConfig()
            .environment(
                env_config={
                    "dataset": ArithmeticTask().train_rows()[:40],
                    "reward_fn": "rllib_p3o.tasks.arithmetic:arithmetic_reward",
                }
            )
            .training(
                model=model,
                group_size=4,
                prompts_per_step=4,
                max_tokens=2,
                lr=1e-3,
                eval_interval=0,
                record_rollouts=record_dir,
            )
            .env_runners(num_env_runners=1)
            .debugging(seed=0)
        )
        tuner = tune.Tuner(
            "P3O",
            param_space=config,
            run_config=tune.RunConfig(
                storage_path=storage,
                name=NAME,
                stop={"training_iteration": iterations},
                verbose=0,
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=2),
            ),
        )
    result = tuner.fit()[0]
    print("DONE", result.metrics["training_iteration"], flush=True)
    if result.error is not None:
        sys.exit(f"the trial failed: {result.error!r}")


if __name__ == "__main__":
    main()
