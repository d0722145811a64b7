"""devtools/same_training.py's comparison (the part that decides; its ``run`` is the demo config's own training)."""

import json

from devtools.same_training import compare


def _write(path, rows, seconds):
    path.write_text(json.dumps({"results": rows, "seconds": seconds}))
    return str(path)


def test_equal_training_values_pass_whatever_the_machine_columns_and_nan_equals_nan(tmp_path, capsys):
    rows = [
        {
            "reward": 0.5,
            "ess": float("nan"),
            "time_this_iter_s": 1.0,
            "p3o/time_train_s": 0.2,
            "perf/cpu_util_percent": 50.0,
        }
    ] * 4
    other = [{**r, "time_this_iter_s": 9.0, "p3o/time_train_s": 0.9, "perf/cpu_util_percent": 99.0} for r in rows]
    before = _write(tmp_path / "before.json", rows, [5.0, 5.0, 1.0, 1.0])
    after = _write(tmp_path / "after.json", [{**r, "p3o/new_metric": 1.0} for r in other], [5.0, 5.0, 1.0, 0.5])
    assert compare([before, after]) == 0
    out = capsys.readouterr().out
    assert "equal; 8 training values compared" in out  # reward and ess, 4 iterations; the times left out
    assert "reported by one of the two only: p3o/new_metric" in out
    assert "after/before: 0.750" in out  # the mean after the first two iterations (warm-up): 0.75 against 1.0


def test_a_training_value_that_differs_fails_and_says_where(tmp_path, capsys):
    before = _write(tmp_path / "before.json", [{"reward": 0.5}, {"reward": 0.6}], [1.0, 1.0])
    after = _write(tmp_path / "after.json", [{"reward": 0.5}, {"reward": 0.6000001}], [1.0, 1.0])
    assert compare([before, after]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "iteration 2, reward: 0.6 vs 0.6000001" in out
