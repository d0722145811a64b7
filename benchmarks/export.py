"""Exporting a checkpoint as a Hugging Face directory: `rllib-p3o export` vs restoring the algorithm.

    python benchmarks/export.py [--repeats 2] [--out results/benchmarks/export.json]

One algorithm checkpoint of the tiny demo-sized model (1 vLLM runner, a local learner; saved right after
`build_algo`), then, alternating, each a fresh process timed from start to exit:
- ``cli_export_s``: ``rllib-p3o export CHECKPOINT OUT`` (reads the policy module's files from the checkpoint and
  writes the base model directory with the trained weights: no Ray, no vLLM, no model code);
- ``imports_s``: a process importing what that export imports (this package, which imports torch and RLlib,
  safetensors, huggingface_hub), and nothing else;
- ``model_code_imports_s``: a process importing transformers and the model's code besides, what an export that
  rebuilds the model (LoRA, ``--tokenizer``, or ``export_hf``) adds;
- ``restore_export_s``: ``P3O.from_checkpoint(CHECKPOINT).export_hf(OUT)`` (starts Ray, the runner's vLLM engine and
  the learner), the way to export before the command existed.
Reported: the median of each and the ratio restore / CLI. Compare figures within one run only (the machine's load
changes them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# What the export imports: this package (torch, RLlib), safetensors and huggingface_hub's writer.
IMPORTS = "import rllib_p3o.cli.export, safetensors.torch; from huggingface_hub import save_torch_state_dict"
# What rebuilding the model adds: transformers and the model's own code.
MODEL_CODE_IMPORTS = (
    IMPORTS + "; import rllib_p3o.learner.rl_module, transformers.models.qwen2.modeling_qwen2; "
    "from transformers import AutoModelForCausalLM, AutoTokenizer, TokenizersBackend"
)

RESTORE = """
import sys, ray
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
from rllib_p3o import P3O
algo = P3O.from_checkpoint(sys.argv[1])
algo.export_hf(sys.argv[2])
algo.stop()
ray.shutdown()
"""

CHECKPOINT = """
import sys, ray
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
from rllib_p3o import P3OConfig
from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward, build_tiny_model
model = build_tiny_model(sys.argv[2])
task = ArithmeticTask()
config = (
    P3OConfig()
    .environment(env_config={"dataset": task.train_rows()[:64], "reward_fn": arithmetic_reward})
    .training(model=model, group_size=4, prompts_per_step=4, max_tokens=3)
    .env_runners(num_env_runners=1)
)
algo = config.build_algo()
algo.save_to_path(sys.argv[1])
algo.stop()
ray.shutdown()
"""


def _timed(args, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "export.json"))
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "checkpoint")
        subprocess.run([py, "-c", CHECKPOINT, checkpoint, os.path.join(tmp, "model")], check=True, env=env)
        runs = {"cli_export_s": [], "imports_s": [], "model_code_imports_s": [], "restore_export_s": []}
        for k in range(args.repeats):
            out = os.path.join(tmp, f"out{k}")
            runs["cli_export_s"].append(_timed([py, "-m", "rllib_p3o.cli", "export", checkpoint, out + "a"], env))
            runs["imports_s"].append(_timed([py, "-c", IMPORTS], env))
            runs["model_code_imports_s"].append(_timed([py, "-c", MODEL_CODE_IMPORTS], env))
            runs["restore_export_s"].append(_timed([py, "-c", RESTORE, checkpoint, out + "b"], env))
            print({key: round(v[-1], 2) for key, v in runs.items()}, flush=True)
    result = {key: statistics.median(v) for key, v in runs.items()}
    result["restore_over_cli"] = result["restore_export_s"] / result["cli_export_s"]
    result.update(runs={k: v for k, v in runs.items()}, repeats=args.repeats, load_average=os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
