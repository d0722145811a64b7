"""Checkpoints that know they are complete (`rllib_p3o.driver.checkpoints`): the manifest written last, what it
catches, and the newest intact Tune sibling. Files on disk; the algorithm's use of it is in test_faults."""

import os

import pytest

from rllib_p3o.driver import checkpoints as ck


def _checkpoint(root, number, files):
    path = root / f"checkpoint_{number:06d}"
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    ck.write_manifest(str(path))
    return str(path)


def test_an_intact_checkpoint_verifies_and_damage_names_the_file(tmp_path):
    path = _checkpoint(tmp_path, 1, {"algorithm_state.pkl": b"x" * 1000, "learner/module/state.pt": b"w" * 5000})
    ck.verify(path)
    state = os.path.join(path, "learner/module/state.pt")
    with open(state, "r+b") as f:
        f.truncate(2000)  # as a crash mid-write or a full disk leaves it
    with pytest.raises(
        ck.DamagedCheckpointError,
        match=r"checkpoint .*checkpoint_000001 is damaged: "
        r"learner/module/state.pt is 2000 bytes, 5000 when it was written",
    ):
        ck.verify(path)
    with open(state, "wb") as f:
        f.write(b"v" * 5000)  # same size, other bytes
    with pytest.raises(ck.DamagedCheckpointError, match="learner/module/state.pt has other contents"):
        ck.verify(path)
    os.remove(state)
    with pytest.raises(ck.DamagedCheckpointError, match="learner/module/state.pt is missing"):
        ck.verify(path)


def test_no_manifest_means_not_finished_and_large_files_are_checked_by_size(tmp_path, monkeypatch):
    unfinished = tmp_path / "checkpoint_000002"
    unfinished.mkdir()
    (unfinished / "algorithm_state.pkl").write_bytes(b"x")
    with pytest.raises(ck.DamagedCheckpointError, match="has no p3o_manifest.json"):
        ck.verify(str(unfinished))
    monkeypatch.setattr(ck, "FULL_HASH_MAX_BYTES", 100)
    monkeypatch.setattr(ck, "SAMPLE_BYTES", 10)
    path = _checkpoint(tmp_path, 3, {"big.pt": bytes(range(200))})
    with open(os.path.join(path, "big.pt"), "r+b") as f:
        f.seek(100)
        f.write(b"\xff")  # a byte in the unsampled middle: not seen, by design
    ck.verify(path)
    with open(os.path.join(path, "big.pt"), "r+b") as f:
        f.write(b"\xff")  # the head: seen
    with pytest.raises(ck.DamagedCheckpointError, match="big.pt has other contents"):
        ck.verify(path)


def test_newest_intact_sibling_skips_damaged_and_newer_ones(tmp_path):
    first = _checkpoint(tmp_path, 1, {"a.pkl": b"1" * 10})
    second = _checkpoint(tmp_path, 2, {"a.pkl": b"2" * 10})
    third = _checkpoint(tmp_path, 3, {"a.pkl": b"3" * 10})
    newest = _checkpoint(tmp_path, 4, {"a.pkl": b"4" * 10})
    with open(os.path.join(third, "a.pkl"), "r+b") as f:
        f.truncate(3)
    assert ck.tune_siblings(newest) == [newest, third, second, first]
    assert ck.newest_intact(newest) == second  # 3 is damaged, 4 is the one being replaced
    assert ck.newest_intact(first) is None
    assert ck.newest_intact(str(tmp_path)) is None  # not a Tune checkpoint directory
