"""`make docs` is strict for real: `mkdocs build --strict` without `--quiet`, with this project's link validation,
fails on a broken link or a broken anchor. A tiny site in a temporary folder (two pages) with the `validation`
section of the project's mkdocs.yml, built by the real mkdocs."""

import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MKDOCS = os.path.join(os.path.dirname(sys.executable), "mkdocs")


def _docs_command():
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    return re.search(r"^docs:.*\n\t(.*)$", makefile, re.M).group(1)


def test_make_docs_builds_strict_and_keeps_the_warnings():
    command = _docs_command()
    assert "mkdocs build --strict" in command
    assert "--quiet" not in command and " -q" not in command  # --quiet drops the warnings --strict counts


def _site(tmp_path, link):
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        validation = yaml.load(f, Loader=yaml.BaseLoader)["validation"]  # BaseLoader: the file has !!python tags
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\nSee [the other page]({link}).\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n\nText.\n")
    config = {"site_name": "t", "docs_dir": "docs", "site_dir": "site", "validation": validation}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [MKDOCS, "build", "--strict"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


def test_a_good_link_builds(processes, tmp_path):
    out = _site(tmp_path, "other.md#a-section")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("link", ["missing.md", "other.md#no-such-section"], ids=["page", "anchor"])
def test_a_broken_link_fails_the_build(processes, tmp_path, link):
    out = _site(tmp_path, link)
    assert out.returncode != 0
    assert "Aborted with 1 warnings in strict mode" in out.stdout + out.stderr, out.stderr
