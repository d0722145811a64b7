"""Provenance of offline data (`rllib_p3o.data.provenance`): whose data a trajectory file is, checked by hand on
files with known writers, and the order a seed draws (`rllib_p3o.data.offline_data.pass_order`)."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_p3o.core.sources import is_other_model_id, offline_source_name, source_id
from rllib_p3o.data import provenance
from rllib_p3o.data.offline_data import pass_order
from rllib_p3o.data.provenance import OTHER_MODEL, POLICY_OWN, classify, fingerprint, lineage, write_lineage


def _fake_model(path, content: bytes):
    """A directory with one weight file (all a fingerprint reads; the rest of a model is not what this is about)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(content)
    return str(path)


def test_fingerprint_tells_weights_apart_and_lineage_follows_an_export(tmp_path):
    base = _fake_model(tmp_path / "base", b"a" * 300_000)
    same = _fake_model(tmp_path / "copy", b"a" * 300_000)
    trained = _fake_model(tmp_path / "trained", b"a" * 150_000 + b"b" + b"a" * 149_999)  # one byte moved
    assert fingerprint(base) == fingerprint(same) and fingerprint(base).startswith("sha256:")
    assert fingerprint(trained) != fingerprint(base)
    assert fingerprint(str(tmp_path / "no-such-model")) is None and fingerprint(None) is None
    assert lineage(base) == {fingerprint(base)}
    # A model exported from a run that started from `base` lists base's lineage: base's recordings are its own.
    write_lineage(trained, trained_from=base)
    assert json.load(open(os.path.join(trained, provenance.LINEAGE_FILE)))["fingerprints"] == [fingerprint(base)]
    assert lineage(trained) == {fingerprint(trained), fingerprint(base)}


def test_classify_reads_the_recorded_fingerprint_against_the_lineage_and_obeys_the_override():
    mine, theirs = "sha256:1111", "sha256:2222"
    own = classify("/d/own.parquet", {("policy-0.5b", mine)}, {mine})
    assert own.kinds == {POLICY_OWN} and own.recorder(mine) is None
    other = classify("/d/other.parquet", {("weak-1b", theirs)}, {mine})
    assert other.kinds == {OTHER_MODEL} and other.recorder(theirs) == "weak-1b"
    assert "not the policy's lineage" in other.line()
    # No provenance (third-party data): another model's, named by its input.
    bare = classify("/hub/gsm8k/part-0.parquet", {(None, None)}, {mine}, input_name="gsm8k")
    assert bare.kinds == {OTHER_MODEL} and bare.recorder(None) == "gsm8k" and "no model_fingerprint" in bare.line()
    # A run with a behavior model recorded both: each row by its own writer.
    both = classify("/d/mixed.parquet", {("policy-0.5b", mine), ("weak-1b", theirs)}, {mine})
    assert both.recorder(mine) is None and both.recorder(theirs) == "weak-1b"
    # The override: for every input, or per input path (a directory holds its files; the longest prefix wins).
    assert classify("/d/other.parquet", {("weak-1b", theirs)}, {mine}, "policy").kinds == {POLICY_OWN}
    assert classify("/d/own.parquet", {("policy-0.5b", mine)}, {mine}, "other").kinds == {OTHER_MODEL}
    per_input = {"/d": "other", "/d/keep": "policy"}
    assert classify("/d/keep/a.parquet", {("x", theirs)}, {mine}, per_input).kinds == {POLICY_OWN}
    assert classify("/d/b.parquet", {("policy-0.5b", mine)}, {mine}, per_input).kinds == {OTHER_MODEL}
    assert classify("/elsewhere/c.parquet", {("policy-0.5b", mine)}, {mine}, per_input).kinds == {POLICY_OWN}


def test_another_models_rows_get_another_models_source_ids():
    for recorded in ("policy", None, "behavior/x"):
        assert is_other_model_id(source_id(offline_source_name(recorded, recorder="weak-1b")))
    assert not is_other_model_id(source_id(offline_source_name("policy")))


def test_read_provenance_on_files_with_and_without_provenance_columns(tmp_path):
    from rllib_p3o.data.trajectories import parquet_locations

    model = _fake_model(tmp_path / "policy", b"p" * 200_000)
    row = {"prompt_ids": [1], "completion_ids": [2], "reward": 1.0, "behavior_logprobs": [-0.1], "group_id": 0}
    own_dir, other_dir, bare_dir = tmp_path / "own", tmp_path / "theirs", tmp_path / "hub_data"
    for d in (own_dir, other_dir, bare_dir):
        d.mkdir()
    writer = {"source": "policy", "model_name": "policy", "model_fingerprint": fingerprint(model)}
    pq.write_table(pa.Table.from_pylist([dict(row, **writer)]), own_dir / "part-0.parquet")
    other = dict(writer, model_name="weak", model_fingerprint="sha256:ffff")
    pq.write_table(pa.Table.from_pylist([dict(row, **other)]), other_dir / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist([row]), bare_dir / "part-0.parquet")
    inputs = [str(own_dir), str(other_dir), str(bare_dir)]
    readings = provenance.read_provenance(parquet_locations(inputs), model, "auto", inputs)
    by_dir = {os.path.basename(os.path.dirname(r.reading.file)): r for r in readings}
    assert by_dir["own"].source_names == {"offline/policy"}
    assert by_dir["theirs"].source_names == {"offline/behavior/weak"}
    assert by_dir["hub_data"].source_names == {"offline/behavior/hub_data"}
    text = provenance.summary([r.reading for r in readings])
    assert text.startswith("provenance: 1 file(s) the policy's own, 2 another model's"), text


def test_a_seed_draws_each_pass_its_own_order_and_file_order_without_shuffle():
    a0, a1, b0 = pass_order(50, 0, 0, True), pass_order(50, 0, 1, True), pass_order(50, 1, 0, True)
    assert sorted(a0) == list(range(50)) and not np.array_equal(a0, a1) and not np.array_equal(a0, b0)
    np.testing.assert_array_equal(a0, pass_order(50, 0, 0, True))  # a restored run draws the same
    np.testing.assert_array_equal(pass_order(50, 3, 2, False), np.arange(50))


@pytest.mark.parametrize("value", ["mine", 3, {"/d": "auto"}])
def test_a_bad_offline_provenance_is_refused_with_the_choices(value):
    from rllib_p3o import P3OConfig
    from rllib_p3o.driver import validation

    config = P3OConfig().training(offline_provenance=value)
    problems = list(validation._offline(config))
    assert problems and "offline_provenance" in problems[0] and "'policy'" in problems[0], problems
