"""Shards on object storage, for real: moto's standalone S3 server over HTTP on loopback.

`stoker prepare` writes shards and manifest to s3://, `stoker run` reads them from there
(each host fetches a shard once into its cache and maps it) and delivers every sample once.
A missing bucket, credentials the server refuses and an unreachable endpoint each fail with
the URI named, within a bounded time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_for

MOTO = Path(sys.executable).with_name("moto_server")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "stoker-test", "AWS_SECRET_ACCESS_KEY": "stoker-test-secret",
               "AWS_REGION": "us-east-1"}


def _moto(folder: Path, **env: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    log = open(folder / f"moto-{port}.log", "w")
    server = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **env})
    return server, port


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory):
    """A second server that authenticates every request: it knows no access key, so it refuses ours."""
    import urllib.request

    server, port = _moto(tmp_path_factory.mktemp("moto-strict"), INITIAL_NO_AUTH_ACTION_COUNT="0")

    def up() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
        except urllib.error.HTTPError:
            return True  # it answers, with a refusal
        except OSError:
            return False
        return True

    try:
        assert wait_for(up, timeout=30), "moto_server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3-protocol server (moto) on a free loopback port, with a bucket `shards`."""
    import pyarrow.fs as pafs

    server, port = _moto(tmp_path_factory.mktemp("moto"))
    endpoint = f"http://127.0.0.1:{port}"
    try:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="stoker-test",
                               secret_key="stoker-test-secret", region="us-east-1", allow_bucket_creation=True)

        def up() -> bool:
            try:
                fs.create_dir("shards")
                return True
            except OSError:
                return False

        assert wait_for(up, timeout=30), "moto_server did not start"
        yield endpoint
    finally:
        server.terminate()
        server.wait(10)


def _env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "STOKER_SHARD_CACHE": str(tmp_path / "cache"),
            **extra}


def _stoker(env: dict[str, str], *args: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, env=env,
                            timeout=timeout)
    return result, time.monotonic() - started


def test_a_job_prepared_on_s3_and_run_from_it_delivers_every_sample_once(s3, raw_images, tmp_path):
    env = _env(s3, tmp_path)
    prepared, _ = _stoker(env, "prepare", "imagenet", str(raw_images), "s3://shards/synth", "--shard-mb", "1")
    assert prepared.returncode == 0, prepared.stderr
    assert not Path("s3:").exists() and not (tmp_path / "s3:").exists()  # nothing written locally by mistake
    out = tmp_path / "summary.json"
    run, _ = _stoker(env, "run", "--data", "s3://shards/synth", "--epochs", "2", "--accel", "null", "--no-progress",
                     "--json", str(out), "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                     "--metrics-port", "-1", "--worker-metrics-port", "-1")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    manifest = json.loads(subprocess.run(
        [sys.executable, "-c", "import pyarrow.fs as f, sys; fs = f.S3FileSystem(endpoint_override=sys.argv[1], "
         "scheme='http', access_key='stoker-test', secret_key='stoker-test-secret', region='us-east-1'); "
         "print(fs.open_input_stream('shards/synth/manifest.json').read().decode())", s3.split("//")[1]],
        capture_output=True, text=True, check=True).stdout)
    assert len(manifest["shards"]) > 1
    assert summary["samples"] == summary["unique_samples"] == 2 * manifest["num_samples"]
    assert summary["skipped_samples"] == 0
    cached = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]  # not locks, checks
    assert len(cached) == len(manifest["shards"])  # each shard fetched once for the whole host, then mapped


@pytest.mark.parametrize("case", ["missing bucket", "refused credentials", "unreachable endpoint"])
def test_storage_that_cannot_serve_fails_naming_the_uri_in_bounded_time(s3, strict_s3, raw_images, tmp_path, case):
    uri = "s3://shards/synth"
    env = _env(s3, tmp_path)
    if case == "missing bucket":
        uri = "s3://no-such-bucket/synth"
    elif case == "refused credentials":
        env["AWS_ENDPOINT_URL"] = strict_s3
    else:
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for args in (["prepare", "imagenet", str(raw_images), uri], ["run", "--data", uri, "--no-progress"]):
        if case == "refused credentials" and args[0] == "prepare":
            continue
        result, took = _stoker(env, *args, timeout=120)
        assert result.returncode != 0, result.stdout
        assert uri in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert took < 60, f"{args[0]} took {took:.0f} s to give up"
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
