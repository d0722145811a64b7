"""LoRA (`rllib_p3o.core.lora`): real peft in the learner, real vLLM LoRA in the runner, real Ray/RLlib/Tune."""

import numpy as np
import pytest
import torch
from helpers import tiny_config
from ray import tune
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3O
from rllib_p3o.core import metrics as m
from rllib_p3o.core.lora import is_adapter_param
from rllib_p3o.runner.env_runner import VLLMEnvRunner

LORA = {"r": 8, "alpha": 16}


def _config(model, **training):
    def starts_with_digit(prompts, completions, **_):
        # Varies within groups for the untrained tiny model (the task's own reward is ~always 0: nothing would
        # train). A local function: cloudpickle ships it to the runner by value.
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    return tiny_config(
        model,
        starts_with_digit,
        rows=200,
        eval_rows=8,
        lr=1e-2,
        **{"minibatch_size": 16, "lora": dict(LORA), **training},
    )


def _module_state(algo):
    state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
    return {k: torch.as_tensor(v).clone() for k, v in state.items()}


def _learner_module(algo):
    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()


def _engine_matches_learner(algo, token_ids):
    engine = np.asarray(algo._runners.call_first(lambda runner: runner.engine_logprobs(token_ids)))
    learner = np.asarray(_learner_module(algo).sequence_logprobs(token_ids))
    return float(np.max(np.abs(engine - learner)))


def test_a_wrong_target_module_fails_at_validation_listing_the_models_layers(tiny_model):
    with pytest.raises(ValueError) as e:
        _config(tiny_model, lora={"r": 8, "target_modules": ["q_proj", "query_key_value"]}).validate()
    assert "query_key_value" in str(e.value)
    for layer in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert layer in str(e.value)
    with pytest.raises(ValueError, match="lm_head"):  # a linear layer, but vLLM serves no adapter on it
        _config(tiny_model, lora={"target_modules": ["lm_head"]}).validate()
    with pytest.raises(ValueError, match="unknown LoRA setting"):
        _config(tiny_model, lora={"rank": 8}).validate()
    config = _config(tiny_model)
    config.validate()
    assert config.lora["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@pytest.mark.slow
def test_lora_trains_the_adapter_only_syncs_it_verified_and_restores_it(ray_session, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    base = {
        f"lm.base_model.model.{k}": v for k, v in AutoModelForCausalLM.from_pretrained(tiny_model).state_dict().items()
    }
    algo = _config(tiny_model, kl_ref_coeff=0.1).build_algo()
    try:
        sequence = algo._runners.call_first(VLLMEnvRunner.probe_token_ids)[::-1]  # not the probe itself
        results = [algo.train() for _ in range(2)]
        module = _learner_module(algo)
        # Only the adapter trains: the base weights are the model's, bit for bit; lora_B left its zero init.
        full = module.state_dict()
        moved = [k for k, v in full.items() if is_adapter_param(k) and ".lora_B." in k and float(v.abs().max()) > 0]
        assert moved
        for name, value in full.items():
            if not is_adapter_param(name):
                hf_name = name.replace(".base_layer.", ".")
                assert torch.equal(value, base[hf_name]), name
        assert all(p.requires_grad == is_adapter_param(n) for n, p in module.named_parameters())
        (optim,) = algo.learner_group._learner._named_optimizers.values()
        num_adapter_tensors = len([n for n in full if is_adapter_param(n)])
        assert sum(len(g["params"]) for g in optim.param_groups) == len(optim.state) == num_adapter_tensors
        # The reference KL used the base with the adapter disabled: no second model was loaded.
        assert not algo.learner_group._learner._ref_models
        assert m.lookup(results[-1], *m.LEARNER, "kl_ref") > 0
        # Each sync shipped the adapter alone and the probe verified it; the engine matches on another sequence.
        adapter_bytes = sum(v.numel() * v.element_size() for k, v in full.items() if is_adapter_param(k))
        for res in results:
            assert res[m.P3O][m.SYNC_PREFIX + m.SYNC_BYTES] == adapter_bytes
            assert res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
        assert _engine_matches_learner(algo, sequence) < 1e-3
        trained = _module_state(algo)
        assert set(trained) == {k for k in full if is_adapter_param(k)}  # checkpoints hold the adapter only
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path

        # Export: the adapter in peft format, and a merged copy; the module's base stays unmerged.
        from peft import PeftModel

        algo.export_hf(str(tmp_path / "adapter"))
        algo.export_hf(str(tmp_path / "merged"), merged=True)
        ids = torch.tensor([sequence])
        with torch.no_grad():
            want = module.lm.eval()(input_ids=ids).logits
            peft_out = (
                PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(tmp_path / "adapter"))
                .eval()(input_ids=ids)
                .logits
            )
            merged_out = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()(input_ids=ids).logits
        module.lm.train()
        assert torch.allclose(peft_out, want, atol=1e-5) and torch.allclose(merged_out, want, atol=1e-4)
        assert torch.equal(
            module.state_dict()[next(k for k in full if "q_proj.base_layer" in k)],
            full[next(k for k in full if "q_proj.base_layer" in k)],
        )
    finally:
        algo.stop()

    restored = P3O.from_checkpoint(checkpoint)
    try:
        state = _module_state(restored)
        assert all(torch.equal(state[k], trained[k]) for k in trained)
        assert _engine_matches_learner(restored, sequence) < 1e-3  # the engine serves the restored adapter
        res = restored.train()
        assert res["training_iteration"] == 3 and res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
    finally:
        restored.stop()


@pytest.mark.slow
def test_lora_with_two_learners_async_and_a_behavior_model_through_tune(
    ray_session, tiny_model, tiny_untied_model, tmp_path
):
    # The behavior model is served without LoRA beside the policy's LoRA engine, in the same runner.
    behavior = [{"model": tiny_untied_model, "samples": 2, "name": "frozen"}]
    config = _config(tiny_model, async_sampling=True, max_staleness=2, behavior_models=behavior).learners(
        num_learners=2, num_cpus_per_learner=1
    )
    result = (
        tune.Tuner(
            "P3O",
            param_space=config,
            run_config=tune.RunConfig(
                storage_path=str(tmp_path),
                name="lora",
                stop={"training_iteration": 3},
                failure_config=tune.FailureConfig(fail_fast="raise"),
                verbose=0,
            ),
        )
        .fit()
        .get_best_result(metric=m.column(m.P3O, m.REWARD_MEAN), mode="max")
    )
    assert result.error is None and result.metrics["training_iteration"] == 3
    assert result.metrics[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3
    assert np.isfinite(m.lookup(result.metrics, *m.LEARNER, m.ESS))
    by_source = result.metrics[m.P3O][m.BY_SOURCE]
    assert set(by_source) == {"policy", "behavior/frozen"}
    assert by_source["behavior/frozen"][m.ESS] < by_source["policy"][m.ESS]


# Every architecture of `build_tiny_model` but Qwen2, which the tests above train. Llama as the report that found
# vLLM wrapping its LM head had it: untied head, 31-token vocabulary, LoRA on q_proj and v_proj. Gemma's are tied, as
# vLLM serves them. Phi3's attention and MLP projections are fused in the checkpoint (qkv_proj, gate_up_proj).
ARCHITECTURE_CASES = [
    ("llama", {"tie_word_embeddings": False, "vocab_size": 31}, ["q_proj", "v_proj"]),
    ("qwen3", {"tie_word_embeddings": False}, None),
    ("mistral", {"tie_word_embeddings": False}, None),
    ("gemma", {"tie_word_embeddings": True}, None),
    ("gemma2", {"tie_word_embeddings": True}, None),
    ("phi3", {"tie_word_embeddings": False}, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("architecture,build,targets", ARCHITECTURE_CASES, ids=[case[0] for case in ARCHITECTURE_CASES])
def test_lora_trains_with_verified_syncs_on_each_architecture(
    ray_session, tmp_path_factory, architecture, build, targets
):
    from rllib_p3o.tasks import build_tiny_model
    from rllib_p3o.tasks.tiny_model import ARCHITECTURES

    assert architecture in ARCHITECTURES
    model = build_tiny_model(str(tmp_path_factory.mktemp("models") / architecture), architecture=architecture, **build)
    lora = dict(LORA, **({"target_modules": targets} if targets else {}))
    # The probe rides along with a generate call of 8 prompts x 4 samples: prompt log-probs in a batch of requests,
    # the case vLLM's LoRA logits path broke on for models whose LM head it wraps (Llama, Qwen3, Phi3).
    algo = _config(model, lora=lora).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        full = _learner_module(algo).state_dict()
        adapter_bytes = sum(v.numel() * v.element_size() for k, v in full.items() if is_adapter_param(k))
        assert any(".lora_B." in k and float(v.abs().max()) > 0 for k, v in full.items() if is_adapter_param(k))
        for res in results:
            assert res[m.P3O][m.SYNC_PREFIX + m.SYNC_BYTES] == adapter_bytes  # the adapter alone
            assert res[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 1e-3  # verified by the riding probe
        sequence = algo._runners.call_first(VLLMEnvRunner.probe_token_ids)[::-1]
        assert _engine_matches_learner(algo, sequence) < 1e-3
    finally:
        algo.stop()
