"""P3O's settings are declared once (`rllib_p3o.core.settings`): the config's defaults, the keys ``.training()``
accepts and its signature, the configuration reference and Tune's reset list all come from those declarations."""

import dataclasses
import inspect
import os
import pydoc

import pytest

from devtools.reference import REFERENCE, SIGNATURE, reference_markdown, render_page, signature_module
from rllib_p3o import P3OConfig
from rllib_p3o.core.losses import LOSSES
from rllib_p3o.core.settings import BY_KEYWORD, GROUPS, SETTINGS, P3OSettings
from rllib_p3o.driver.trial_reuse import RESETTABLE_KEYS


def test_every_setting_has_help_a_group_and_a_type():
    assert len(SETTINGS) == len(dataclasses.fields(P3OSettings)) > 40
    for s in SETTINGS:
        assert len(s.help.split()) >= 4, f"{s.name} lacks help text"
        assert s.group in GROUPS, s.name
        assert s.type and s.type != "None", s.name


def test_the_reference_page_is_generated_from_the_declarations():
    page = REFERENCE.read_text()
    assert render_page(page) == page, "docs/reference/configuration.md is stale: run `make reference`"
    tables = reference_markdown()
    for s in SETTINGS:
        assert f"| `{s.keyword}` |" in tables
    for name in LOSSES:  # every registered loss, with its loss_config keys
        assert f"| `{name}` |" in tables
    assert "`kl_estimator='k3_is'`, `kl_anchor='auto'`" in tables  # p3o's own settings


def test_the_config_takes_its_defaults_and_keys_from_the_declarations():
    config = P3OConfig()
    for s in SETTINGS:
        assert getattr(config, s.name) == s.default(), s.name
    assert P3OConfig().loss_config is not config.loss_config  # a fresh dict per config
    values = {"model": "/m", "group_size": 4, "loss_config": {"kl_estimator": "k3_is"}, "eval_interval": 0, "lr": 3e-4}
    config = P3OConfig().training(**values)
    assert (config.policy_model, config.group_size, config.loss_config) == ("/m", 4, {"kl_estimator": "k3_is"})
    assert (config.eval_interval, config.lr) == (0, 3e-4)  # one of ours and one of RLlib's
    with pytest.raises(TypeError, match="no_such_setting"):
        P3OConfig().training(no_such_setting=1)


def test_validation_checks_each_declared_choice_and_minimum():
    for key, value, match in [
        ("logprobs_mode", "soft", "logprobs_mode must be one of processed, raw"),
        ("loss_config", {"ess_scope": "tokens"}, "ess_scope must be one of batch, source, version, got 'tokens'"),
        ("group_size", 1, "group_size must be >= 2, got 1"),
        ("num_threads_per_env_runner", 0, "num_threads_per_env_runner must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            P3OConfig().training(model="/m", **{key: value}).validate()


def test_the_reset_list_is_derived_from_the_declarations():
    ours = {s.name for s in SETTINGS if s.resettable}
    assert ours <= set(RESETTABLE_KEYS) and {"loss", "loss_config", "eval_interval", "lr", "seed"} <= set(
        RESETTABLE_KEYS
    )
    assert "group_size" not in RESETTABLE_KEYS  # the runners' prompt groups: new runners


def test_help_and_the_signature_of_training_list_every_setting_with_its_type_default_and_help():
    assert SIGNATURE.read_text() == signature_module(), "training_signature.py is stale: run `make reference`"
    parameters = inspect.signature(P3OConfig.training).parameters
    text = pydoc.render_doc(P3OConfig.training)
    for s in SETTINGS:
        assert parameters[s.keyword].kind is inspect.Parameter.KEYWORD_ONLY, s.keyword
        assert parameters[s.keyword].annotation == s.type, s.keyword
        default = repr(s.default()) if not isinstance(s.default(), str) else f'"{s.default()}"'
        assert f"{s.keyword} ({s.type}, default {default}): " in text, s.keyword
        # ... and what it does: its help text, as the configuration reference gives it (wrapped)
        assert " ".join(s.help.split()[:8]) in " ".join(text.split()), s.keyword
    assert "**kwargs" in text  # RLlib's own keys (lr, ...) pass through


def test_path_settings_are_resolved_where_the_script_runs(tmp_path, monkeypatch):
    (tmp_path / "base").mkdir()
    monkeypatch.chdir(tmp_path)
    config = P3OConfig().training(
        model="base",
        behavior_models=[{"model": "base", "samples": 2}, {"model": "org/hub-id"}],
        record_rollouts="out/traj",
        offline_rescore_model="org/scorer",
        offline_provenance={"data/weaker": "other", "s3://b/own": "policy"},
    )
    base = os.path.join(str(tmp_path), "base")
    assert config.offline_provenance == {os.path.join(str(tmp_path), "data", "weaker"): "other", "s3://b/own": "policy"}
    assert config.policy_model == base and config.behavior_models[0]["model"] == base
    assert config.behavior_models[1]["model"] == "org/hub-id" and config.offline_rescore_model == "org/scorer"
    assert config.record_rollouts == os.path.join(str(tmp_path), "out", "traj")
    assert P3OConfig().training(record_rollouts="s3://bucket/traj").record_rollouts == "s3://bucket/traj"
    assert {s.keyword for s in SETTINGS if s.path} == {
        "model",
        "behavior_models",
        "offline_rescore_model",
        "record_rollouts",
        "offline_provenance",
    }


def test_env_config_paths_are_resolved_where_the_script_runs(tmp_path, monkeypatch):
    (tmp_path / "rm").mkdir()
    monkeypatch.chdir(tmp_path)
    config = P3OConfig().environment(env_config={"dataset": "train.jsonl", "reward_models": {"model": "rm"}})
    assert config.env_config["dataset"] == str(tmp_path / "train.jsonl")  # a data path, whether or not it exists yet
    assert config.env_config["reward_models"] == [{"model": str(tmp_path / "rm")}]  # one spec becomes a list
    specs = [{"model": "rm", "name": "q"}, {"model": "org/hub-rm"}]
    config = P3OConfig().environment(env_config={"reward_models": specs, "eval_dataset": "s3://b/heldout.jsonl"})
    assert config.env_config["reward_models"] == [{"model": str(tmp_path / "rm"), "name": "q"}, {"model": "org/hub-rm"}]
    assert config.env_config["eval_dataset"] == "s3://b/heldout.jsonl" and specs[0]["model"] == "rm"  # not mutated


def test_removed_keys_are_refused():
    for key, value in (("clip_low", 0.3), ("model_dtype", "bfloat16"), ("ess_scope", "source")):
        with pytest.raises(TypeError, match=key):
            P3OConfig().training(**{key: value})


def test_each_default_is_declared_once_and_read_alike_by_the_function_the_registry_the_sweep_and_the_reference():
    """P3O's defaults live in `P3OLossSettings`: the exported `p3o_loss`'s keyword defaults, the registered loss's
    settings, the sweep's method defaults and its default method, and the configuration reference all read them."""
    from rllib_p3o.core.losses import get_loss
    from rllib_p3o.core.losses.p3o import P3OLossSettings, p3o_loss
    from rllib_p3o.sweep.grid import DEFAULT_METHOD, DEFAULTS, METHODS

    declared = P3OLossSettings()
    params = inspect.signature(p3o_loss).parameters
    for name in ("kl_estimator", "trust_region"):
        assert params[name].default == getattr(declared, name), name
    assert get_loss("p3o").make_settings({}) == declared
    assert get_loss("p3o").ess_scope_of(declared) == declared.ess_scope
    assert get_loss(METHODS[DEFAULT_METHOD]["loss"]).make_settings(METHODS[DEFAULT_METHOD]["loss_config"]) == declared
    assert DEFAULTS == {key: BY_KEYWORD[key].default() for key in DEFAULTS}
    reference = open(os.path.join(os.path.dirname(__file__), "..", "docs", "reference", "configuration.md")).read()
    row = next(line for line in reference.splitlines() if line.startswith("| `p3o` |"))
    for field in dataclasses.fields(P3OLossSettings):
        assert f"`{field.name}={getattr(declared, field.name)!r}`" in row, field.name
    for setting in SETTINGS:  # every top-level setting's default, as the reference lists it
        assert f"`{setting.keyword}`" in reference, setting.keyword
