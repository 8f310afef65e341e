"""Tune storage on an S3-compatible endpoint (moto on 127.0.0.1), a ``file://`` URI and a plain path.

What this pins down for Ray 2.60 + pyarrow >= 15 (see ``tests/s3server.py``):
- ``RunConfig(storage_path="s3://bucket/prefix")`` resolves its filesystem with
  ``pyarrow.fs.FileSystem.from_uri``; pyarrow reads ``AWS_ENDPOINT_URL`` (scheme included), so with
  ``S3Server.env`` in the environment a plain ``s3://`` URI reaches the local endpoint. The other
  way is ``?endpoint_override=127.0.0.1:PORT&scheme=http`` on the URI, which wins over the env.
- The resolved ``S3FileSystem`` is pickled to the trial workers with its endpoint but not its
  credentials: every node needs the AWS credentials in its environment (here: set before
  ``ray.init`` so the raylet and its workers inherit them).
- With query parameters, ``f"{uri}/{name}"`` is wrong (it lands in the query string); join with
  ``ray.air._internal.uri_utils.URI(uri) / name``. ``Tuner.restore`` keeps the query parameters.
- ``Result.path`` / ``ResultGrid.experiment_path`` / ``Checkpoint.path`` are paths on their
  ``.filesystem`` (``bucket/prefix/...``, no scheme), not URIs: keep the URI you gave.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("moto")
from ray import tune  # noqa: E402
from ray.air._internal.uri_utils import URI  # noqa: E402

from tests.s3server import S3Server  # noqa: E402

# what Tune and pyarrow do with storage URIs; the product path is in test_multinode.py
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ITERS = 3


def _trainable(config: dict) -> None:
    """Three reports, each with a checkpoint; says whether this worker saw the AWS credentials."""
    has_creds = int(bool(os.environ.get("AWS_ACCESS_KEY_ID")))
    for i in range(ITERS):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "step.txt").write_text(str(i + 1))
            tune.report({"step": i + 1, "score": config["x"] * (i + 1), "worker_has_creds": has_creds},
                        checkpoint=tune.Checkpoint.from_directory(d))


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def ray_s3(s3):
    """A private Ray whose raylet (and so every worker) inherits the S3 env: it must be in
    ``os.environ`` before ``ray.init``, since workers do not see later changes to the driver's env."""
    saved = {k: os.environ.get(k) for k in s3.env}
    os.environ.update(s3.env)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=128 * 1024 * 1024,
             log_to_driver=False)
    try:
        yield s3
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _storage(kind: str, s3: S3Server, tmp_path: Path) -> str:
    if kind == "s3":
        return s3.uri("sweeps/env")
    if kind == "s3-query":
        return s3.uri("sweeps/query") + f"?endpoint_override=127.0.0.1:{s3.port}&scheme=http"
    if kind == "file-uri":
        return (tmp_path / "tune").as_uri()
    return str(tmp_path / "tune")


def _stored_files(kind: str, s3: S3Server, tmp_path: Path, name: str) -> list[str]:
    """Files under the experiment directory, relative to it."""
    if kind.startswith("s3"):
        prefix = f"sweeps/{'env' if kind == 's3' else 'query'}/{name}/"
        return [k[len(prefix):] for k in s3.list(prefix) if not k.endswith("/")]
    root = tmp_path / "tune" / name
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("kind", ["s3", "s3-query", "file-uri", "local-path"])
def test_tune_storage_roundtrip(kind, ray_s3, tmp_path, monkeypatch):
    s3 = ray_s3
    if kind == "s3-query":
        # A dead endpoint in the env proves the URI's query parameters are what is used, on the
        # driver and (through the pickled filesystem) on the workers.
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    storage, name = _storage(kind, s3, tmp_path), f"exp-{kind}"
    xs = [1, 2] if kind.startswith("s3") else [2]  # two trials where it matters, one for local sanity
    exp_uri = str(URI(storage) / name)
    if kind == "s3-query":
        assert exp_uri.endswith(f"/{name}?endpoint_override=127.0.0.1:{s3.port}&scheme=http")
        assert (storage + "/" + name).endswith("scheme=http/" + name)  # naive join lands in the query

    results = tune.Tuner(
        _trainable,
        param_space={"x": tune.grid_search(xs)},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()

    assert results.num_errors == 0
    assert sorted(r.metrics["score"] for r in results) == [x * ITERS for x in xs]
    best = results.get_best_result()
    assert best.checkpoint is not None and best.checkpoint.path.endswith(f"checkpoint_{ITERS - 1:06d}")
    with best.checkpoint.as_directory() as d:  # read back through the checkpoint's own filesystem
        assert Path(d, "step.txt").read_text() == str(ITERS)
    if kind.startswith("s3"):
        assert best.checkpoint.filesystem.type_name == "s3"
        assert results.experiment_path == f"{s3.bucket}/sweeps/{'env' if kind == 's3' else 'query'}/{name}"
        assert all(r.metrics["worker_has_creds"] == 1 for r in results)  # workers inherited the env

    files = _stored_files(kind, s3, tmp_path, name)
    assert "tuner.pkl" in files
    assert any(f.startswith("experiment_state-") and f.endswith(".json") for f in files)
    trial_dirs = {f.split("/")[0] for f in files if "/" in f}
    assert len(trial_dirs) == len(xs)
    for t in trial_dirs:
        for i in range(ITERS):
            assert f"{t}/checkpoint_{i:06d}/step.txt" in files, (t, i, files)
        assert f"{t}/result.json" in files

    assert tune.Tuner.can_restore(exp_uri)
    assert not tune.Tuner.can_restore(str(URI(storage) / "no-such-experiment"))
    restored = tune.Tuner.restore(exp_uri, _trainable)
    got = restored.get_results()
    assert sorted(r.metrics["score"] for r in got) == [x * ITERS for x in xs]
    assert got.get_best_result().checkpoint is not None
    resumed = restored.fit()  # all trials finished: nothing reruns, but the state is written back
    assert resumed.num_errors == 0 and len(resumed) == len(xs)
