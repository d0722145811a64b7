"""`benchmarks/gpu_session.sh`'s stages (`benchmarks/learner_gpu.py`) rehearsed at the tiny shape on a CPU, in this
process: every figure (a path's batch, a flex case, a max-rows probe) is on disk before the next one starts, so a
stage killed at its time limit keeps what it finished (here "killed" at a chosen figure); the max-rows search's
probes. (The script itself: `tests/test_learner_gpu_bench.py`.)"""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "learner_gpu.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("learner_gpu_rehearsal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Killed(BaseException):
    """The stage's time limit, at a chosen figure (a BaseException, as the kill: no ``except Exception`` stops it)."""


def watch(monkeypatch, bench, function, out, count, kill_at):
    """Wrap ``bench.<function>`` (what computes one figure): at each call, how many figures ``out`` holds then
    (``count`` of its JSON; None before the file exists); the ``kill_at``-th call ends the stage instead."""
    seen = []
    real = getattr(bench, function)

    def watched(*args, **kwargs):
        seen.append(count(json.loads(out.read_text())) if out.exists() else None)
        if len(seen) == kill_at:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, function, watched)
    return seen


def run_until_killed(bench, argv):
    with pytest.raises(Killed):
        bench.main(argv)


def test_the_learner_stage_writes_each_path_and_batch_before_the_next_starts(processes, bench, monkeypatch, tmp_path):
    out = tmp_path / "learner_tiny.json"

    def count(report):
        return sum(len(batch["paths"]) for batch in report["batches"].values())

    seen = watch(monkeypatch, bench, "train_steps", out, count, kill_at=5)
    argv = ["--shape", "tiny", "--device", "cpu", "--rows", "2", "3", "--paths", "padded", "packed_fused", "packed"]
    run_until_killed(bench, argv + ["--warmup", "0", "--steps", "1", "--out", str(out)])
    assert seen == [0, 1, 2, 3, 4]  # the header first, then each (path, rows) before the next one starts
    report = json.loads(out.read_text())
    assert report["rows"] == [2, 3] and report["peak_memory"] == "process peak resident set (VmHWM)"
    done = {(rows, name): record for rows, b in report["batches"].items() for name, record in b["paths"].items()}
    assert sorted(done) == [("2", "packed_fused"), ("2", "padded"), ("3", "packed_fused"), ("3", "padded")]
    for record in done.values():
        assert record["s_per_step"] > 0 and record["real_tokens_per_s"] > 0 and record["peak_memory_gib"] > 0
    assert {record["lm_head"] for (_, name), record in done.items() if name == "packed_fused"} == {"fused"}
    assert report["batches"]["2"]["fused_vs_chunked"] == {}  # packed (its chunked twin) was killed before it ran


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flex_stage_writes_each_case_before_the_next_starts(processes, bench, monkeypatch, tmp_path):
    out = tmp_path / "flex.json"
    seen = watch(monkeypatch, bench, "flex_gaps", out, lambda report: len(report["cases"]), kill_at=4)
    # flex_gaps computes every case but the learner's check: the 4th call is the 5th case
    run_until_killed(bench, ["--flex", "--shape", "tiny", "--device", "cpu", "--out", str(out)])
    assert seen == [0, 1, 3, 4]  # each case on disk before the next starts; the 5th case killed
    cases = json.loads(out.read_text())["cases"]
    # tests/test_flex_packing.py's case first, then at the check shape the learner's packing check's rows and what
    # that check decides under flex attention, then the test's rows.
    order = ["tiny_hd64/float32/test", "tiny/float32/packing_check", "tiny/float32/learner_packing_check"]
    assert list(cases) == order + ["tiny/float32/test"]
    assert cases.pop("tiny/float32/learner_packing_check") == {"packing": True}
    for name, gaps in cases.items():  # packed flex attention is exact on a CPU
        assert gaps["pass"] is True and gaps["flex_packed"] <= 1e-4 and gaps["sdpa_packed"] <= 1e-4, (name, gaps)


def test_the_max_rows_stage_writes_each_probe_before_the_next(processes, bench, monkeypatch, tmp_path):
    out = tmp_path / "max_rows.json"

    def count(report):
        return sum(len(path["probes"]) for path in report["paths"].values())

    seen = watch(monkeypatch, bench, "_probe", out, count, kill_at=5)
    argv = ["--max-rows", "--shape", "tiny", "--device", "cpu", "--rows", "2", "--max-rows-cap", "8"]
    run_until_killed(bench, argv + ["--paths", "packed_fused", "padded", "--out", str(out)])
    assert seen == [0, 1, 2, 3, 4]  # the 5th probe killed
    paths = json.loads(out.read_text())["paths"]
    fused = paths["packed_fused"]
    assert [p["rows"] for p in fused["probes"]] == [2, 4, 8] and all(p["fits"] for p in fused["probes"])
    assert fused["largest_fitting_rows"] == 8 and fused["stopped"] == "fits at the cap of 8 rows"
    assert [p["rows"] for p in paths["padded"]["probes"]] == [2]


@pytest.mark.parametrize(
    "fit_below,probes,largest",
    [
        (45, [16, 32, 64, 48, 40], 40),  # doubling, then halving the gap to 8 rows
        (5000, [16, 32, 64, 128, 256, 512, 1024], 1024),  # fits up to the cap
        (1020, [16, 32, 64, 128, 256, 512, 1024, 768, 896, 960, 992, 1008, 1016], 1016),  # the cap does not fit
        (10, [16, 8], 8),  # the first probe does not fit: halving down
        (0, [16, 8], 0),  # nothing fits
    ],
)
def test_the_max_rows_search_doubles_then_halves_the_gap(bench, fit_below, probes, largest):
    fits, fails, rows, tried = 0, None, 16, []
    while rows:
        tried.append(rows)
        if rows <= fit_below:
            fits = max(fits, rows)
        else:
            fails = rows if fails is None else min(fails, rows)
        rows = bench.next_probe(fits, fails, cap=1024, resolution=8)
    assert tried == probes and fits == largest
