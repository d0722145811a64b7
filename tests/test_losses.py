"""The loss registry as an extension point: each loss declares and validates its own settings (``loss_config``),
returns the fixed `LossOutput`, and a module dropped into `rllib_p3o/core/losses/` is registered without editing
anything else. No Ray here: the config is validated, not built."""

import dataclasses
import pathlib
import pkgutil
import re

import pytest
import torch

import rllib_p3o.core.losses as losses_pkg
from rllib_p3o import P3OConfig
from rllib_p3o.core.losses import LOSSES, LossInputs, LossOutput, get_loss, register_loss

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _batch():
    torch.manual_seed(0)
    logp = (torch.randn(2, 5) * 0.3 - 1.0).requires_grad_(True)
    behavior = logp.detach() + torch.randn(2, 5) * 0.2
    old = logp.detach() + torch.randn(2, 5) * 0.05  # π_old, for the losses that read it
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    return LossInputs(logp, behavior, torch.tensor([1.0, -0.5]), mask, old_logprobs=old)


def test_every_module_of_the_losses_package_is_imported_and_registers():
    modules = {m.name for m in pkgutil.iter_modules(losses_pkg.__path__)} - set(losses_pkg.SHARED_MODULES)
    assert {"p3o", "grpo"} <= modules
    registered_from = {spec.fn.__module__.rpartition(".")[2] for spec in LOSSES.values()}
    assert modules <= registered_from  # each module registered at least one loss


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_registered_loss_returns_the_fixed_output(name):
    spec = get_loss(name)
    out = spec.fn(_batch(), spec.make_settings())
    assert isinstance(out, LossOutput)
    assert out.loss.dim() == 0 and out.loss.requires_grad
    assert out.ess.dim() == 0 and 0.0 < float(out.ess) <= 1.0
    assert all(torch.is_tensor(v) for v in out.metrics.values())


def test_grpo_settings_come_from_loss_config_and_are_validated_by_the_loss():
    config = P3OConfig().training(model="/m", loss="grpo", loss_config={"clip_low": 0.1, "clip_high": 0.28})
    assert config.loss_settings() == get_loss("grpo").settings(clip_low=0.1, clip_high=0.28)
    with pytest.raises(ValueError, match=r"loss 'grpo' has no setting 'clip' \(its settings: clip_high, clip_low\)"):
        P3OConfig().training(model="/m", loss="grpo", loss_config={"clip": 0.1}).validate()
    with pytest.raises(ValueError, match=r"loss 'grpo': clip_low must be in \[0, 1\), got 1.5"):
        P3OConfig().training(model="/m", loss="grpo", loss_config={"clip_low": 1.5}).validate()
    with pytest.raises(
        ValueError,
        match=r"loss 'p3o' has no setting 'clip_low' \(its settings: ess_scope, kl_anchor, kl_estimator, other_model_weight, trust_region\)",
    ):
        P3OConfig().training(model="/m", loss="p3o", loss_config={"clip_low": 0.2}).validate()


def test_grpo_settings_reach_the_math():
    spec = get_loss("grpo")
    tight = spec.fn(_batch(), spec.make_settings({"clip_low": 0.01, "clip_high": 0.01}))
    loose = spec.fn(_batch(), spec.make_settings({"clip_low": 0.9, "clip_high": 10.0}))
    assert float(tight.metrics["clip_fraction"]) > float(loose.metrics["clip_fraction"]) == 0.0


def test_a_loss_settings_class_must_be_a_dataclass():
    with pytest.raises(TypeError, match="must be a dataclass"):
        register_loss("bad", settings=dict)


def _contributing_example() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Adding a loss") :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 2, "CONTRIBUTING.md: the loss example and its test"
    return blocks


def test_the_contributing_example_registers_validates_and_passes_its_own_test(tmp_path, monkeypatch):
    """Runs CONTRIBUTING.md's worked example as written: its loss file (outside the package here, so that the
    test leaves the package untouched) and its test."""
    loss_module, loss_test = _contributing_example()[:2]
    (tmp_path / "example_loss.py").write_text(loss_module)
    (tmp_path / "test_example_loss.py").write_text(loss_test.replace("rllib_p3o.core.losses.tis_pg", "example_loss"))
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(LOSSES)
    try:
        import example_loss  # noqa: F401  (registers the example's loss)
        import test_example_loss

        name = next(n for n in LOSSES if n not in saved)
        settings = get_loss(name).settings
        assert len(dataclasses.fields(settings)) == 1
        field = dataclasses.fields(settings)[0].name
        assert getattr(P3OConfig().training(loss=name, loss_config={field: 3.0}).loss_settings(), field) == 3.0
        for test in [getattr(test_example_loss, t) for t in dir(test_example_loss) if t.startswith("test_")]:
            test()
    finally:
        LOSSES.clear()
        LOSSES.update(saved)


def test_every_registered_loss_is_a_sweep_method_by_its_name():
    from rllib_p3o.sweep.grid import METHODS

    for name in LOSSES:
        assert name in METHODS, name  # `rllib-p3o sweep --methods NAME` (its choices are METHODS)
    assert METHODS["grpo_tis"] == {"loss": "grpo_tis"}  # the loss's own defaults
    assert METHODS["p3o_k3_is"]["loss_config"] == {
        "kl_estimator": "k3_is",
        "kl_anchor": "behavior",
        "trust_region": "none",
        "ess_scope": "batch",
        "other_model_weight": "ess_cap",
    }  # bundles stay (as the grids ran them: one ESS per batch, the paper's weight on another model's tokens)


def test_the_papers_reference_form_is_one_setting_away():
    """``loss="p3o_reference"`` is ``p3o`` with the reference implementation's settings and one ESS per batch (no ESS
    groups, whatever ``ess_scope`` says): the same loss and gradient as those settings spelled out."""
    spec = get_loss("p3o_reference")
    assert not spec.ess_scoped  # one ESS over the batch, as the paper's code
    reference = spec.fn(_batch(), spec.make_settings({}))
    spelled = get_loss("p3o").fn(
        _batch(),
        get_loss("p3o").make_settings({"kl_estimator": "k3_clamped", "kl_anchor": "behavior", "trust_region": "none"}),
    )
    assert torch.equal(reference.loss.detach(), spelled.loss.detach())
    inputs = _batch()
    spec.fn(inputs, spec.make_settings({})).loss.backward()
    other = _batch()
    get_loss("p3o").fn(other, get_loss("p3o").make_settings(dict(kl_estimator="k3_clamped", kl_anchor="behavior",
                       trust_region="none"))).loss.backward()  # fmt: skip
    assert torch.equal(inputs.logprobs.grad, other.logprobs.grad)
    with pytest.raises(ValueError, match="has no setting"):
        P3OConfig().training(model="/m", loss="p3o_reference", loss_config={"trust_region": "ess_clip"}).validate()
