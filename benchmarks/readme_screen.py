"""What a person who follows the README's quick start sees on the screen: its Tune example, run as written.

The README's quick-start code block is taken from README.md and run in a fresh Python process with plain
``ray.init()`` (as the README writes it), with only what cannot run here replaced: the model path (the tiny local
model), the generation length (the tiny model's context), the resources (this machine's CPUs) and the number of
iterations. Every line the script writes (stdout and stderr) is counted, and the status table's header is kept
(it should name the run's figures).

    python benchmarks/readme_screen.py [--iterations 10] [--out runs/readme_screen]

Writes OUT/screen.txt (the screen) and results/benchmarks/readme_screen.json (the line count and what was found).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "benchmarks", "readme_screen.json")
# vLLM's per-sync warnings of the layerwise reload (`rllib_p3o/runner/vllm_ext.py`).
SYNC_WARNING = "Failed to load weights"


def quick_start_code(readme: str) -> str:
    """The README's first ```python block after "## Quick start"."""
    section = readme.split("## Quick start", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def adapted(code: str, model: str, iterations: int) -> str:
    """The quick start with what cannot run on this machine replaced; each replacement must match once."""
    replacements: List[Tuple[str, str]] = [
        (r'model="/path/to/hf-causal-lm"', f"model={model!r}"),
        (r"max_tokens=\d+", "max_tokens=4"),  # the tiny model's context is 128 tokens
        (r"num_env_runners=\d+", "num_env_runners=1"),  # 2 CPU cores: one runner, the learner in the trial actor
        (r"\.learners\([^)]*\)", ".learners(num_learners=0)"),  # no GPU here
        (r'stop=\{"training_iteration": \d+\}', f'stop={{"training_iteration": {iterations}}}'),
    ]
    for pattern, new in replacements:
        code, n = re.subn(pattern, new, code)
        if n != 1:
            raise ValueError(f"the README's quick start no longer has exactly one {pattern!r} ({n} found)")
    return code


def write_datasets(workdir: str) -> None:
    """train.jsonl and heldout.jsonl in the working directory, as the README names them (the arithmetic task)."""
    from rllib_p3o.tasks import ArithmeticTask

    task = ArithmeticTask()
    for name, rows in (("train.jsonl", task.train_rows()[:512]), ("heldout.jsonl", task.heldout_rows()[:64])):
        with open(os.path.join(workdir, name), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


def run(workdir: str, iterations: int, timeout_s: float = 900.0) -> Dict:
    """Run the README's quick start in ``workdir`` (a fresh process, its own Ray); returns the screen and counts."""
    from rllib_p3o.tasks import build_tiny_model

    os.makedirs(workdir, exist_ok=True)
    model = build_tiny_model(os.path.join(workdir, "model"))
    write_datasets(workdir)
    with open(os.path.join(ROOT, "README.md")) as f:
        code = adapted(quick_start_code(f.read()), model, iterations)
    script = os.path.join(workdir, "quick_start.py")
    with open(script, "w") as f:
        f.write(code)
    # A person's shell: none of the test session's Ray/vLLM settings; Tune's results under this HOME (its default
    # storage is ~/ray_results); RAY_ADDRESS=local keeps plain ray.init() from joining another cluster on the machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "TUNE_", "RLLIB_P3O_"))}
    env.update(
        HOME=workdir,
        XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
        RAY_ADDRESS="local",
        PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, script],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    screen = proc.stdout
    with open(os.path.join(workdir, "screen.txt"), "w") as f:
        f.write(screen)
    lines = screen.splitlines()
    # The status table's header: `IterationPrinter`'s, or Tune's own ("Trial name  status  iter ...").
    headers = [line for line in lines if line.split()[:1] == ["iter"] or line.lstrip("│| ").startswith("Trial name")]
    return {
        "iterations": iterations,
        "returncode": proc.returncode,
        "seconds": round(time.time() - t0, 1),
        "screen_lines": len(lines),
        "sync_warning_lines": sum(SYNC_WARNING in line for line in lines),
        "status_table_header": headers[-1].strip() if headers else None,
        "screen": screen,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default="runs/readme_screen")
    parser.add_argument("--label", default="current", help="key of this measurement in the results file")
    args = parser.parse_args()
    result = run(os.path.abspath(args.out), args.iterations)
    screen = result.pop("screen")
    print(screen[-4000:])
    print(json.dumps(result, indent=2))
    previous = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            previous = json.load(f)
    previous[args.label] = result
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(previous, f, indent=2)
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
