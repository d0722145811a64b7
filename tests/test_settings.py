"""P3O's settings are declared once (`rllib_p3o.core.settings`): the config's defaults, the keys ``.training()``
accepts, the configuration reference and Tune's reset list all come from those declarations."""

import dataclasses
import warnings

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core import deprecation
from rllib_p3o.core.losses import LOSSES
from rllib_p3o.core.settings import GROUPS, REFERENCE, SETTINGS, P3OSettings, reference_markdown, render_page
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
        ("ess_scope", "tokens", "ess_scope must be one of batch, source, version, got 'tokens'"),
        ("logprobs_mode", "soft", "logprobs_mode must be one of processed, raw"),
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


def test_renamed_keys_warn_once_with_the_new_name_and_the_removal_version(monkeypatch):
    monkeypatch.setattr(deprecation, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = P3OConfig().training(loss="grpo", clip_low=0.3, model_dtype="bfloat16")
        P3OConfig().training(clip_low=0.1)  # the second time: silent
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("clip_low" in m and "loss_config['clip_low']" in m and "0.4" in m for m in messages), messages
    assert any("model_dtype" in m and "use precision" in m for m in messages), messages
    assert sum("clip_low" in m for m in messages) == 1
    assert config.loss_settings().clip_low == 0.3 and config.resolved_precision == "bf16"  # and still work
