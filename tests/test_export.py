"""`rllib-p3o export` on policy-module checkpoints written by RLlib's Checkpointable (`save_to_path`), each
exported and loaded back with transformers: the base directory with the trained weights in place (tied and
untied heads, float32 and bfloat16), and the rebuilt module where that does not apply (LoRA, ``--tokenizer``).
No Ray: the checkpoints are of the module alone, as the learner writes it inside an algorithm checkpoint."""

import json
import os

import pytest
import torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_p3o.data.provenance import fingerprint, lineage
from rllib_p3o.driver import export as export_cli
from rllib_p3o.driver.export import OutputNotEmpty, export
from rllib_p3o.learner.rl_module import HFCausalLMRLModule
from rllib_p3o.runner.env import TextEnv


def _trained_checkpoint(model, path, **model_config):
    """A module whose weights moved away from the base model's, saved where an algorithm checkpoint at ``path``
    holds it."""
    module = RLModuleSpec(
        module_class=HFCausalLMRLModule,
        observation_space=TextEnv.observation_space_default(),
        action_space=TextEnv.action_space_default(),
        model_config={"model": model, **model_config},
    ).build()
    with torch.no_grad():
        for p in module.lm.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    module.save_to_path(os.path.join(path, export_cli.MODULE_DIR))
    return module


def _rebuild_fails(monkeypatch):
    """The direct path reads the files only: building the module (the other path) fails the test."""

    def no_rebuild(*args, **kwargs):
        raise AssertionError("export rebuilt the module")

    monkeypatch.setattr(HFCausalLMRLModule, "from_checkpoint", no_rebuild)


@pytest.mark.parametrize(
    "base, dtype", [("tiny_model", "float32"), ("tiny_untied_model", "float32"), ("tiny_model", "bfloat16")]
)
def test_export_writes_the_base_directory_with_the_trained_weights(base, dtype, request, tmp_path, monkeypatch):
    model = request.getfixturevalue(base)
    module = _trained_checkpoint(model, str(tmp_path / "ckpt"), dtype=dtype)
    _rebuild_fails(monkeypatch)
    out = export(str(tmp_path / "ckpt"), str(tmp_path / "out"))

    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["dtype"] == dtype  # what save_pretrained would record
    assert sorted(f for f in os.listdir(out) if "safetensors" in f) == ["model.safetensors"]
    # Its lineage: a run that starts from the export reads the recordings of the run that trained it as its own.
    assert lineage(out) == {fingerprint(out), fingerprint(model)} and fingerprint(out) != fingerprint(model)
    AutoTokenizer.from_pretrained(out)
    exported = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    theirs, mine = exported.state_dict(), module.lm.state_dict()
    assert set(theirs) == set(mine)
    for name, tensor in mine.items():
        assert theirs[name].dtype == tensor.dtype and torch.equal(theirs[name], tensor), name
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, module.lm(input_ids=ids).logits)


def test_export_rebuilds_the_module_under_lora_and_with_another_tokenizer(tiny_untied_model, tiny_model, tmp_path):
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}
    module = _trained_checkpoint(tiny_untied_model, str(tmp_path / "lora_ckpt"), lora=lora)
    adapter = export(str(tmp_path / "lora_ckpt"), str(tmp_path / "adapter"))
    assert os.path.isfile(os.path.join(adapter, "adapter_config.json"))  # peft format, not a full model
    merged = export(str(tmp_path / "lora_ckpt"), str(tmp_path / "merged"), merged=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(
            AutoModelForCausalLM.from_pretrained(merged)(input_ids=ids).logits,
            module.lm(input_ids=ids).logits,
            atol=1e-5,
            rtol=1e-5,
        )

    _trained_checkpoint(tiny_model, str(tmp_path / "ckpt"))
    out = export(str(tmp_path / "ckpt"), str(tmp_path / "out"), tokenizer=tiny_untied_model)
    assert (
        AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tiny_untied_model).get_vocab()
    )


def test_names_the_base_does_not_have_send_the_export_to_the_rebuilt_module(tiny_model):
    base = export_cli.base_weight_shapes(tiny_model)
    state = {export_cli.LM_PREFIX + name: torch.zeros(shape) for name, shape in base.items()}
    assert export_cli.weights_under_base_names(state, base) is not None
    extra = dict(state, **{export_cli.LM_PREFIX + "lm_head.weight": torch.ones(next(iter(base.values())))})
    assert export_cli.weights_under_base_names(extra, base) is None  # not a copy of a tensor the base has
    missing = dict(state)
    missing.pop(next(iter(missing)))
    assert export_cli.weights_under_base_names(missing, base) is None
    assert export_cli.weights_under_base_names({**state, "value_head.weight": torch.zeros(1)}, base) is None


def test_export_refuses_a_directory_that_holds_files(tiny_model, tmp_path):
    """Into the base model's own directory (it would overwrite it), or over an earlier export (a stale adapter or
    weight file is what transformers would load)."""
    _trained_checkpoint(tiny_model, str(tmp_path / "ckpt"))
    before = {name: os.path.getmtime(os.path.join(tiny_model, name)) for name in os.listdir(tiny_model)}
    with pytest.raises(OutputNotEmpty, match="already exists and is not empty"):
        export(str(tmp_path / "ckpt"), tiny_model)
    assert before == {name: os.path.getmtime(os.path.join(tiny_model, name)) for name in os.listdir(tiny_model)}
    (tmp_path / "empty").mkdir()
    export(str(tmp_path / "ckpt"), str(tmp_path / "empty"))  # an empty directory is fine
    with pytest.raises(OutputNotEmpty):
        export(str(tmp_path / "ckpt"), str(tmp_path / "empty"))
