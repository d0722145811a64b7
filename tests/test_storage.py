"""Object stores through pyarrow's filesystems (`rllib_p3o.core.storage`): an S3-compatible server started by the test
(moto's, on 127.0.0.1, as Ray's own storage tests use) as Tune's storage_path, the recording target, the offline
input, `rllib-p3o validate`'s, `export_hf`'s and `rllib-p3o export`'s (checkpoint and output); and URIs nothing can
honour, refused by name. Real Ray, RLlib, Tune, Ray Data, vLLM and pyarrow; the server is moto's S3 (credentials are
the dummy ones of `tests/conftest.py`)."""

import socket
import sys

import pyarrow.fs
import pyarrow.parquet as pq
import pytest
import ray
from helpers import tiny_config
from ray import tune

from rllib_p3o import P3OConfig
from rllib_p3o.cli import main as cli_main
from rllib_p3o.core import metrics as m
from rllib_p3o.core import storage

BUCKET = "p3o-test"
# Ray actors unpickle this module's functions by value (the tests directory is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def length_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


@pytest.fixture(scope="module")
def s3():
    """``key -> s3://p3o-test/key?endpoint_override=...`` on a moto server of this process, and its filesystem."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        fs = pyarrow.fs.S3FileSystem(endpoint_override=endpoint, region="us-east-1", allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        yield (lambda key: f"s3://{BUCKET}/{key}?endpoint_override={endpoint}&region=us-east-1"), fs
    finally:
        server.stop()


def _bucket_files(fs, prefix):
    selector = pyarrow.fs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True)
    return sorted(i.path for i in fs.get_file_info(selector) if i.type == pyarrow.fs.FileType.File)


def _config(model, **training):
    return tiny_config(model, length_reward, rows=200, max_tokens=3, **training)


@pytest.mark.slow
def test_tune_storage_recording_offline_input_validate_and_export_on_an_object_store(ray_session, tiny_model, s3):
    uri, fs = s3
    # Online, through Tune: the recording and Tune's experiment (results, checkpoint) land in the bucket.
    result = tune.Tuner(
        "P3O",
        param_space=_config(tiny_model, record_rollouts=uri("traj")),
        run_config=tune.RunConfig(
            storage_path=uri("tune"),
            name="online",
            stop={"training_iteration": 2},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            failure_config=tune.FailureConfig(fail_fast="raise"),
            verbose=0,
        ),
    ).fit()[0]
    assert result.error is None and result.metrics["training_iteration"] == 2
    recorded = _bucket_files(fs, "traj")
    assert recorded == [f"{BUCKET}/traj/part-{i:07d}.parquet" for i in range(2)]
    assert pq.read_table(recorded[0], filesystem=fs).num_rows == 32
    tune_files = _bucket_files(fs, "tune/online")
    assert any(f.endswith("/result.json") for f in tune_files)
    assert any("/checkpoint_000000/" in f for f in tune_files)

    # `rllib-p3o export` from the trial's directory in the bucket (its newest checkpoint) into the bucket.
    (checkpoint,) = {f.split("/checkpoint_000000/")[0] for f in tune_files if "/checkpoint_000000/" in f}
    assert cli_main(["export", uri(checkpoint.removeprefix(f"{BUCKET}/")), uri("cli_export")]) == 0
    exported = _bucket_files(fs, "cli_export")
    assert {f"{BUCKET}/cli_export/{name}" for name in ("config.json", "model.safetensors", "tokenizer.json")} <= set(
        exported
    )

    # `rllib-p3o validate` reads the bucket.
    assert cli_main(["validate", uri("traj"), "--model", tiny_model]) == 0

    # Offline: Ray Data reads the recording from the bucket; export_hf writes into it.
    algo = (
        P3OConfig()
        .training(model=tiny_model, group_size=4, prompts_per_step=8, lr=1e-3)
        .offline_data(input_=uri("traj"))
        .env_runners(num_env_runners=0)
        .build_algo()
    )
    try:
        res = algo.train()
        assert res[m.P3O][m.NUM_OFFLINE_ROWS] == 32 and res[m.P3O][m.TRAINED_TOKENS] > 0
        assert algo.export_hf(uri("export")) == uri("export")
    finally:
        algo.stop()
    exported = _bucket_files(fs, "export")
    assert {f"{BUCKET}/export/{name}" for name in ("config.json", "model.safetensors", "tokenizer.json")} <= set(
        exported
    )


def test_uris_that_cannot_be_honoured_are_refused_by_name(tiny_model):
    with pytest.raises(ValueError, match=r"record_rollouts='foo://bucket/traj'.*no filesystem for 'foo://'"):
        _config(tiny_model, record_rollouts="foo://bucket/traj").validate()
    with pytest.raises(ValueError, match=r"model='s3://bucket/model' is a URI.*local directory"):
        _config("s3://bucket/model").validate()
    with pytest.raises(ValueError, match=r"input_='foo://x/y'"):
        _config(tiny_model).offline_data(input_="foo://x/y").validate()
    with pytest.raises(SystemExit) as e:
        from rllib_p3o.sweep.run import main as sweep_main

        sweep_main(["--quick", "--out", "s3://bucket/sweep"])
    assert e.value.code == 2
    with pytest.raises(storage.StorageError, match="foo://"):
        storage.locate("foo://bucket/x")
    # A single URI as offline input stays a URI (RLlib would make it a pathlib.Path: "s3:/b/k").
    assert _config(tiny_model).offline_data(input_="s3://b/k").input_ == ["s3://b/k"]
    local = storage.locate("relative/dir")
    assert local.is_local and local.uri == str(local) and local.path.endswith("/relative/dir")
