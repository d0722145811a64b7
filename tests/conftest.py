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
# Every plain `ray.init()` of the suite (the session's, and the scripts it starts) starts a Ray of its own: with two
# test workers, the one running tests/test_multinode.py's `ray.cluster_utils.Cluster` writes its address to
# /tmp/ray/ray_current_cluster, which a plain `ray.init()` of the other worker would otherwise join.
os.environ.setdefault("RAY_ADDRESS", "local")


def _build_matplotlib_font_cache() -> None:
    """On a fresh machine the first ``import matplotlib.pyplot`` builds matplotlib's font cache, which runs
    ``fc-list`` as a process: inside a fast test (a results figure, reasoning-gym's import) the guard below would take
    it for the test starting one, so whether the suite passed depended on which test imported it first. Built here,
    once, before any test."""
    import matplotlib.font_manager  # noqa: F401


_build_matplotlib_font_cache()

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


# What makes a test slow here: a Ray session (actors, Tune), a vLLM engine, a process of its own, the demo base model's
# pretraining or a cluster of nodes, each asked for as a fixture (directly, or through another fixture: pytest lists
# both). Such tests are marked `slow` when collected, so `pytest -m "not slow"` is the edit-test loop's fast subset
# (CONTRIBUTING.md); `make test` runs everything. A test may also be marked slow by hand (a script run through
# `subprocess` directly). A test of the fast subset that starts a process or Ray anyway fails
# and says which fixture to take (`_fast_tests_start_nothing`), so the marking cannot drift from what tests do.
SLOW_FIXTURES = frozenset({"ray_session", "processes", "demo_base_model", "two_nodes"})


def is_slow(fixturenames) -> bool:
    """Whether a test with these fixtures (transitively) is slow: one of `SLOW_FIXTURES`, or a vLLM engine's."""
    names = set(fixturenames)
    return bool(names & SLOW_FIXTURES) or any("engine" in name for name in names)


# `make test` runs the suite on two workers (pytest-xdist, ``--dist loadgroup``); each group runs on one worker, in
# one process: a file's tests together (its module fixtures, the scenario runs its tests check, run once), and the
# tests that take the demo's base model together across files (it is pretrained once, by the first of them).
SHARED_ACROSS_FILES = ("demo_base_model",)


def xdist_group(item) -> str:
    """The worker group of a test: the session fixture of `SHARED_ACROSS_FILES` it takes, else its file."""
    names = set(getattr(item, "fixturenames", ()))
    return next((name for name in SHARED_ACROSS_FILES if name in names), item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


class Processes:
    """What a test that starts processes uses (the `processes` fixture): `subprocess.run` with the output captured as
    text, and `subprocess.Popen`; asking for the fixture is what marks the test slow."""

    @staticmethod
    def run(args, **kwargs):
        import subprocess

        kwargs.setdefault("capture_output", not {"stdout", "stderr"} & set(kwargs))
        kwargs.setdefault("text", True)
        return subprocess.run(args, **kwargs)

    @staticmethod
    def popen(args, **kwargs):
        import subprocess

        return subprocess.Popen(args, **kwargs)


@pytest.fixture(scope="session")
def processes():
    """Starts processes for a test or a fixture (scripts as users run them, CLIs, spawned workers): see
    `Processes`."""
    return Processes()


@pytest.fixture(autouse=True)
def _fast_tests_start_nothing(request, monkeypatch):
    """In a test not marked slow, starting a process, Ray or torch's process spawning fails at once, naming the fixture
    that marks a test slow: the fast subset stays fast, and its marking true."""
    if is_slow(request.fixturenames) or request.node.get_closest_marker("slow"):
        yield  # (a test marked slow by hand is out of the fast subset as well)
        return
    import subprocess

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(
                f"{request.node.nodeid} {what} but is not marked slow: take the `processes` fixture (a process), "
                "`ray_session` (Ray) or an engine fixture (tests/conftest.py)"
            )

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process"))
    try:
        import ray

        monkeypatch.setattr(ray, "init", refuse("starts Ray"))
    except ImportError:
        pass
    yield


# Each test's duration by phase, written when the session ends (every `make test` and CI run): where the suite's time
# goes, measured (CONTRIBUTING.md's table of the slowest scenarios comes from this file). A module or session fixture's
# cost lands in the setup of the first test that asks for it.
DURATIONS_FILE = os.environ.get(
    "P3O_TEST_DURATIONS", os.path.join(os.path.dirname(__file__), "..", "test-results", "durations.csv")
)
_durations: dict = {}


def pytest_runtest_logreport(report):
    nodeid = report.nodeid.rsplit("@", 1)[0] if "@" in report.nodeid else report.nodeid  # (xdist: "id@group")
    phases = _durations.setdefault(nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0, "slow": False})
    phases[report.when] = report.duration
    phases["slow"] = phases["slow"] or "slow" in report.keywords


def pytest_sessionfinish(session, exitstatus):
    if not _durations or hasattr(session.config, "workerinput"):  # (an xdist worker: the controller writes)
        return
    import csv

    os.makedirs(os.path.dirname(DURATIONS_FILE), exist_ok=True)
    rows = sorted(_durations.items(), key=lambda kv: -(kv[1]["setup"] + kv[1]["call"] + kv[1]["teardown"]))
    with open(DURATIONS_FILE, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["test", "total_s", "setup_s", "call_s", "teardown_s", "slow", "load_average_1min_at_end"])
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        for nodeid, p in rows:
            total = p["setup"] + p["call"] + p["teardown"]
            writer.writerow(
                [
                    nodeid,
                    f"{total:.2f}",
                    f"{p['setup']:.2f}",
                    f"{p['call']:.2f}",
                    f"{p['teardown']:.2f}",
                    p["slow"],
                    f"{load:.2f}",
                ]
            )
