"""Every tensor the learner's math creates lives on its inputs' device.

The H200 session (`benchmarks/gpu_session.sh`, stage check) found ``m2po`` failing on CUDA: M2PO's second-moment
mask divided a CUDA tensor by a ``torch.arange`` made on the CPU. CI has no GPU, so this reads the code instead: a
tensor factory in the learner's math (`rllib_p3o/core`, `rllib_p3o/learner`) names its ``device``, or it is listed
here with why it may stay on the CPU. On a GPU, ``benchmarks/learner_gpu.py --check`` runs every loss on the device.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn", "linspace", "eye"}
# file: factories that stay on the CPU on purpose, each with its reason
ALLOWED_ON_CPU = {
    # The batch's source ids are a numpy column: the other model's rows are found on the CPU, then indexed.
    "rllib_p3o/learner/p3o_torch_learner.py": {"as_tensor"},
}


def factory_calls_without_device(path: pathlib.Path):
    """(line, factory) of every ``torch.<factory>(...)`` call in ``path`` without a ``device=`` keyword."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = node.func
        if target.attr in FACTORIES and isinstance(target.value, ast.Name) and target.value.id == "torch":
            if not any(k.arg == "device" for k in node.keywords):
                yield node.lineno, target.attr


def test_the_learners_math_creates_its_tensors_on_the_inputs_device():
    found = []
    for folder in ("rllib_p3o/core", "rllib_p3o/learner"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for line, factory in factory_calls_without_device(path):
                if factory not in ALLOWED_ON_CPU.get(rel, set()):
                    found.append(f"{rel}:{line} torch.{factory}(...) without device=")
    assert not found, "tensors made on the CPU beside device inputs:\n" + "\n".join(found)


def test_the_reader_finds_a_factory_without_its_device(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import torch\nx = torch.arange(3, dtype=torch.float64)\ny = torch.zeros(2, device=x.device)\n")
    assert list(factory_calls_without_device(source)) == [(2, "arange")]
