"""`benchmarks/learner_gpu.py` runs where only torch and transformers are installed: here at the tiny shape on CPU,
in a subprocess where importing Ray or vLLM fails (a meta-path finder refuses them), as on a GPU machine without
them; `benchmarks/gpu_session.sh --rehearse` refuses to write into results/. And with Ray installed,
``import rllib_p3o`` still registers "P3O" with Tune."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "learner_gpu.py")
SESSION = os.path.join(ROOT, "benchmarks", "gpu_session.sh")

# Python run with -c: Ray and vLLM cannot be imported, then the code given.
WITHOUT_RAY = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoRayNoVllm(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("ray", "vllm"):
                raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoRayNoVllm())
    """
)


def _run_without_ray(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_the_package_imports_without_ray_and_says_what_needs_it(processes):
    proc = _run_without_ray(
        """
        import rllib_p3o
        from rllib_p3o.learner.compute import TokenLogprobs  # noqa: F401
        try:
            rllib_p3o.P3OConfig
        except ImportError as e:
            print("P3OConfig:", e)
        assert not [m for m in sys.modules if m.partition(".")[0] in ("ray", "vllm")]
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "P3OConfig: rllib_p3o.P3OConfig needs Ray" in proc.stdout


def test_the_benchmark_runs_every_path_and_the_check_without_ray(processes, tmp_path):
    out, check = tmp_path / "tiny.json", tmp_path / "check.json"
    paths = ["buckets_64", "padded", "buckets_measured", "default", "packed", "packed_fused"]
    proc = _run_without_ray(
        f"""
        import runpy
        sys.argv = [{SCRIPT!r}, "--shape", "tiny", "--device", "cpu", "--warmup", "1", "--steps", "2",
                    "--paths", *{paths!r}, "--out", {str(out)!r}]
        runpy.run_path({SCRIPT!r}, run_name="__main__")
        sys.argv = [{SCRIPT!r}, "--check", "--shape", "tiny", "--device", "cpu", "--out", {str(check)!r}]
        runpy.run_path({SCRIPT!r}, run_name="__main__")
        assert not [m for m in sys.modules if m.partition(".")[0] in ("ray", "vllm")]
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ray_importable"] is False and report["peak_flops"] is None  # a CPU: no MFU
    assert report["rows"] == [6] and "6*N" in report["mfu_formula"]
    batch = report["batches"]["6"]
    assert batch["batch"]["rows"] == 6
    assert sorted(batch["paths"]) == sorted(paths)
    for name, record in batch["paths"].items():
        assert "error" not in record, (name, record.get("traceback"))
        assert record["s_per_step"] > 0 and len(record["step_s"]) == 2 and record["real_tokens_per_s"] > 0
        assert record["peak_memory_gib"] > 0
    assert batch["paths"]["padded"]["forward_passes"] == 1
    assert batch["paths"]["packed"]["packing"] is True
    assert batch["paths"]["packed"]["token_positions"] < batch["paths"]["padded"]["token_positions"]
    assert batch["paths"]["default"]["packing"] is False  # a CPU keeps the bucket plan
    assert batch["paths"]["packed"]["lm_head"] == "chunked" and batch["paths"]["packed_fused"]["lm_head"] == "fused"
    assert batch["paths"]["default"]["lm_head"] == "chunked"  # the tiny shape's logits are far below 64 MiB
    assert set(batch["fused_vs_chunked"]) == {"packed"} and batch["fused_vs_chunked"]["packed"]["time_ratio"] > 0
    result = json.loads(check.read_text())
    assert result["pass"] == {
        "packed_float32": True,
        "packed_bf16": True,
        "fused_head_float32": True,
        "fused_head_bf16": True,
        "losses": True,
    }, result
    assert result["fused_vs_chunked_head_float32"]["logp_max_abs_diff"] < 1e-5


def test_a_rehearsal_does_not_write_into_results(processes):
    env = {**os.environ, "OUT": "results/benchmarks/learner_gpu_h200"}
    proc = subprocess.run(["bash", SESSION, "--rehearse"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "a rehearsal does not write into results/" in proc.stderr
    bad = subprocess.run(["bash", SESSION, "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr


def test_import_rllib_p3o_registers_p3o_with_tune(processes):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import rllib_p3o; from ray.tune.registry import TRAINABLE_CLASS, _global_registry; "
            "assert _global_registry.contains(TRAINABLE_CLASS, 'P3O'); "
            "assert _global_registry.get(TRAINABLE_CLASS, 'P3O') is rllib_p3o.P3O",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
