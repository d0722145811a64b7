"""Shared fixtures: tiny locally built models (no hub access) and a Ray session sized for 2 cores."""

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Credentials for the S3-compatible server `tests/test_storage.py` starts on 127.0.0.1 (it accepts any). Set before
# Ray starts, so every Ray worker (runners, learners, Ray Data, Tune) inherits them, as on a real cluster; existing
# ones are kept. No instance-metadata lookups.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

# The session's Ray: more logical CPUs than cores, so a runner and learners fit; the work itself is tiny.
RAY_SESSION = dict(
    num_cpus=6,
    include_dashboard=False,
    log_to_driver=False,
    runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING"}},
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Tiny Qwen2 with tied embeddings and the arithmetic tokenizer."""
    from rllib_p3o.tasks import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("models") / "tiny_tied"))


@pytest.fixture(scope="session")
def tiny_untied_model(tmp_path_factory):
    from rllib_p3o.tasks import build_tiny_model

    return build_tiny_model(
        str(tmp_path_factory.mktemp("models") / "tiny_untied"), tie_word_embeddings=False, seed=1, init_std=0.1
    )


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """Tiny Qwen2 whose tokenizer has ChatML-style turn tokens, tool-call tags and a chat template."""
    from rllib_p3o.tasks import ArithmeticTask, build_tiny_model
    from rllib_p3o.tasks.tiny_model import CHAT_TEMPLATE, CHAT_TOKENS

    corpus = ArithmeticTask().corpus() + ["system user assistant tool add calc"] * 10
    return build_tiny_model(
        str(tmp_path_factory.mktemp("models") / "tiny_chat"),
        corpus,
        vocab_size=80,
        special_tokens=CHAT_TOKENS,
        added_tokens=("<tool_call>", "</tool_call>"),
        chat_template=CHAT_TEMPLATE,
    )


@pytest.fixture(scope="session")
def demo_base_model(tmp_path_factory):
    """Where the getting-started script's base model (the demo's, ~90 s of pretraining on 2 cores) is kept once a test
    has built it, for the next test that runs the script: `helpers.copy_demo_base_model` copies it in (or the one
    ``make demo`` built under ``runs/demo/``), `helpers.keep_demo_base_model` keeps a new build. The script's own
    cache check (``build_demo_model``: same settings, same thread count) decides whether the copy is used."""
    return tmp_path_factory.mktemp("demo_base_model") / "base_model"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(**RAY_SESSION)
    yield
    ray.shutdown()


# What makes a test slow here: a Ray session (actors, Tune), a vLLM engine, or a process of its own. Such tests are
# marked `slow` when collected, so `pytest -m "not slow"` is the edit-test loop's fast subset (CONTRIBUTING.md);
# `make test` runs everything.
_SLOW_FIXTURES = {"ray_session"}
_SLOW_SOURCE = ("LLM(", "build_algo(", "subprocess.", "ray.init(")


def pytest_collection_modifyitems(config, items):
    sources = {}
    for item in items:
        path = str(item.fspath)
        if path not in sources:
            with open(path) as f:
                sources[path] = any(marker in f.read() for marker in _SLOW_SOURCE)
        uses_engine = any("engine" in name for name in getattr(item, "fixturenames", ()))
        if sources[path] or uses_engine or _SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
