"""Every command a results page quotes reproduces the file the page cites: the script exists, its own argparse parser
accepts every flag (`results_check/argv_probe.py` runs the script up to its ``parse_args``, in one subprocess), and
the output it would write is the committed file the page names. Reads files and parses arguments only."""

import glob
import json
import os
import subprocess
import sys

import pytest

from results_check.commands import page_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PAGES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
COMMANDS = [(page, command) for page in PAGES for command in page_commands(open(os.path.join(ROOT, page)).read())]
SCRATCH = ("runs/", "/tmp/")
# Pages whose commands are being rewritten, with who owns the change; each is skipped with its reason, not silently.
PENDING: dict = {}


def _load(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def _peer_trl_agrees(ns, report):
    """peer_trl.py's report: one setting per size × limit, the modes asked for, the steps asked for."""
    settings = {f"{size}, <= {tokens} tokens" for size in ns["sizes"] for tokens in ns["max_tokens"]}
    modes = {f"project/{m}" for m in ns["project_modes"]} | {f"peer/{m}" for m in ns["peer_modes"]}
    assert set(report["runs"]) == settings, "the file holds other sizes or lengths than the command runs"
    assert all(set(runs) == modes for runs in report["runs"].values()), "the file holds other modes"
    assert report["steps"] == ns["steps"]


def _async_vs_sync_agrees(ns, report):
    assert report["target"] == ns["target"]


def _iteration_agrees(ns, report):
    if ns["max_tokens"]:
        assert {r.split("/")[0] for r in report["runs"]} == {f"max_tokens={t}" for t in ns["max_tokens"]}
    else:
        assert "mean_per_iteration" in report


# What a script's file records of its arguments, checked against the command's.
AGREES = {
    "benchmarks/peer_trl.py": _peer_trl_agrees,
    "benchmarks/async_vs_sync.py": _async_vs_sync_agrees,
    "benchmarks/iteration.py": _iteration_agrees,
}


@pytest.fixture(scope="module")
def parsed(processes):
    """Each command's namespace and outputs from its script's own parser."""
    request = json.dumps([[command.script, command.argv] for _, command in COMMANDS])
    out = subprocess.run(
        [sys.executable, "-m", "results_check.argv_probe"],
        input=request,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip([id(c) for _, c in COMMANDS], json.loads(out.stdout.splitlines()[-1])))


def test_the_pages_quote_commands():
    assert len(COMMANDS) >= 20
    assert {page for page, _ in COMMANDS} >= {"docs/results/benchmarks.md", "docs/results/soak.md"}


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p.split('/')[-1]}: {c.line[:60]}" for p, c in COMMANDS])
def test_the_command_writes_the_file_the_page_cites(parsed, page, command):
    if page in PENDING:
        pytest.skip(PENDING[page])
    assert os.path.isfile(os.path.join(ROOT, command.script)), f"no script {command.script}"
    result = parsed[id(command)]
    assert "error" not in result, f"{command.line}: {result.get('error')}"
    outputs = [o for o in result["outputs"] if not o.startswith(SCRATCH)]
    if not result["outputs"]:
        return  # a command that writes nothing (a check): nothing to reproduce
    if not outputs and not command.cited and not command.copied_to:
        return  # a usage example writing a scratch folder: the page cites no result for it
    if not outputs:  # only a scratch folder: the page says where its files were copied
        assert command.copied_to, f"{command.line} writes only {result['outputs']}; the page names no copy"
        for folder in command.copied_to:
            assert os.path.exists(os.path.join(ROOT, folder)), folder
        return
    assert command.cited, f"{page}: {command.line} writes {outputs}; the page cites no file for it"
    assert command.cited[0] in outputs, f"{page}: {command.line} writes {outputs}, the page cites {command.cited[0]}"
    for path in outputs:
        assert os.path.exists(os.path.join(ROOT, path)), f"{command.line} writes {path}, which is not committed"
    if command.script in AGREES and command.cited[0].endswith(".json"):
        AGREES[command.script](result["namespace"], _load(command.cited[0]))


def test_a_flag_the_script_lacks_or_a_wrong_output_is_caught(processes, tmp_path):
    request = [
        ["benchmarks/peer_trl.py", ["--sizes", "10M", "--no-such-flag"]],
        ["benchmarks/peer_trl.py", ["--sizes", "10M"]],
    ]
    out = subprocess.run(
        [sys.executable, "-m", "results_check.argv_probe"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    bad_flag, no_out = json.loads(out.stdout.splitlines()[-1])
    assert "unrecognized arguments: --no-such-flag" in bad_flag["error"]
    assert no_out["outputs"] == ["results/benchmarks/peer_trl.json"]  # not peer_trl_10M.json
    with pytest.raises(AssertionError, match="other sizes or lengths"):
        _peer_trl_agrees(no_out["namespace"], _load("results/benchmarks/peer_trl_10M.json"))
