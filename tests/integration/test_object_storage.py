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


# ---- what enters the host is checked; the cache keeps to its limit --------------------------------------------


def _bucket(endpoint: str):
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(endpoint_override=endpoint.split("//")[1], scheme="http", access_key="stoker-test",
                             secret_key="stoker-test-secret", region="us-east-1")


def _upload(endpoint: str, manifest, prefix: str) -> str:
    """The shards and manifest of `manifest` at s3://shards/PREFIX; returns the manifest's URI."""
    fs = _bucket(endpoint)
    for file in sorted(Path(manifest.uri).parent.iterdir()):
        with fs.open_output_stream(f"shards/{prefix}/{file.name}") as out:
            out.write(file.read_bytes())
    return f"s3://shards/{prefix}/manifest.json"


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_cached_copy_is_fetched_again_and_no_wrong_pixel_trains(s3, sixteen, expected, tmp_path, log_dir,
                                                                          monkeypatch, damage):
    from stoker.pipeline.store.shards import Manifest
    from tests.helpers import run_recorded
    from tests.shard_edits import rows_of

    uri = _upload(s3, sixteen, f"cached-{damage}")
    env = _env(s3, tmp_path)
    for name, value in env.items():  # this process fills the cache, and its consumer reads the manifest
        monkeypatch.setenv(name, value)
    Manifest.load(uri).open_shard(3)  # shard 3 in the host's cache, as an earlier job leaves it; now damaged
    (cached,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    data = bytearray(cached.read_bytes())
    if damage == "flipped":
        jpeg = rows_of(sixteen)[sixteen.shards[3].first_sample_id + 5][2]
        at = data.index(jpeg) + len(jpeg) // 2
        data[at: at + 16] = bytes(b ^ 0xFF for b in data[at: at + 16])
    else:
        data = data[: len(data) // 2]
    cached.write_bytes(bytes(data))
    job, recorder, metrics = run_recorded(uri, log_dir, env=env)
    assert job.summary.skipped == [] and job.summary.unique_samples == sixteen.num_samples
    assert recorder.wrong(expected) == [] and len(recorder.trained) == sixteen.num_samples
    assert metrics["stoker_worker_shard_cache_damaged_total"] == 1
    assert metrics["stoker_worker_shard_fetches_total{result=ok}"] == len(sixteen.shards)  # 9 new, 1 again


def test_a_shard_replaced_in_the_bucket_is_refused_and_none_of_it_trains(s3, sixteen, expected, tmp_path, log_dir,
                                                                         monkeypatch):
    from tests.helpers import assert_exactly_once, run_recorded
    from tests.shard_edits import ROWS, rows_of

    uri = _upload(s3, sixteen, "replaced")
    env = _env(s3, tmp_path)
    for name, value in env.items():  # the consumer, in this process, reads the manifest from the bucket too
        monkeypatch.setenv(name, value)
    victim = sixteen.shards[3]
    data = bytearray((Path(sixteen.uri).parent / victim.path).read_bytes())
    jpeg = rows_of(sixteen)[victim.first_sample_id + 5][2]
    at = data.index(jpeg) + len(jpeg) // 2
    data[at: at + 16] = bytes(b ^ 0xFF for b in data[at: at + 16])
    with _bucket(s3).open_output_stream(f"shards/replaced/{victim.path}") as out:
        out.write(bytes(data))  # the manifest still names the bytes it was made with
    job, recorder, metrics = run_recorded(uri, log_dir, env=env)
    assert_exactly_once(job.summary, sixteen.num_samples, 1, skipped_per_epoch=ROWS)
    ids = set(range(victim.first_sample_id, victim.first_sample_id + ROWS))
    assert {s["sample_id"] for s in job.summary.skipped} == ids
    assert all(s["reason"].startswith(f"shard {victim.path}: fetched bytes have sha256 ") for s in job.summary.skipped)
    assert recorder.wrong(expected) == [] and not ids & {i for _, i in recorder.trained}
    assert metrics["stoker_worker_shard_fetches_total{result=mismatch}"] == 2  # fetched once more, then refused
    assert metrics["stoker_worker_shards_refused_total{reason=sha256}"] == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".") and victim.path in p.name]


def test_the_cache_limit_holds_with_two_processes_fetching_at_once(s3, sixteen, tmp_path):
    """Each process keeps open the shard of its unit and the last IDLE_KEEP: two processes need at most
    2 x (1 + IDLE_KEEP) shards at once, which is the limit here, less than the ten shards of the set."""
    import threading

    from stoker.pipeline.store.open_shards import IDLE_KEEP
    from stoker.pipeline.store.shard_cache import CacheConfig, ShardCache

    uri = _upload(s3, sixteen, "limited")
    gb = 2 * (1 + IDLE_KEEP) * max(s.num_bytes for s in sixteen.shards) / (1 << 30)
    cache = ShardCache(CacheConfig(tmp_path / "cache", int(gb * (1 << 30))))
    most, done = [0], threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            most[0] = max(most[0], cache.usage())

    watcher = threading.Thread(target=watch)
    watcher.start()
    out = tmp_path / "summary.json"
    try:
        run, _ = _stoker(_env(s3, tmp_path), "run", "--data", uri, "--epochs", "2", "--hosts", "1", "--procs", "2",
                         "--shard-cache-gb", repr(gb), "--batch-size", "8", "--unit-batches", "2", "--image-size", "32",
                         "--accel", "null", "--no-progress", "--json", str(out), "--data-bind", "tcp://127.0.0.1:0",
                         "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1", "--worker-metrics-port", "-1")
    finally:
        done.set()
        watcher.join()
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["samples"] == summary["unique_samples"] == 2 * sixteen.num_samples and summary["skipped"] == []
    assert 0 < most[0] <= cache.cfg.limit_bytes and cache.usage() <= cache.cfg.limit_bytes
    assert "over its limit" not in run.stderr
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) < len(sixteen.shards)


def test_a_slow_store_is_named_storage_by_the_bottleneck(s3, sixteen, tmp_path):
    """The bucket behind a relay that passes 2 MB/s, and a shard cache that keeps only what one process
    has open: every unit fetches its shard again from the slow store. The workers spend most of their
    time waiting on those reads, and the run's bottleneck says storage, not the workers' cores."""
    from stoker.pipeline.store.open_shards import IDLE_KEEP
    from tests.helpers import DelayProxy

    uri = _upload(s3, sixteen, "slow")
    gb = (1 + IDLE_KEEP) * max(s.num_bytes for s in sixteen.shards) / (1 << 30)
    port = free_port()
    proxy = DelayProxy({("127.0.0.1", port): (("127.0.0.1", int(s3.rsplit(":", 1)[1])), 0.0)}, bytes_per_s=2e6)
    out = tmp_path / "summary.json"
    try:
        run, _ = _stoker(_env(f"http://127.0.0.1:{port}", tmp_path), "run", "--data", uri, "--epochs", "2",
                         "--hosts", "1", "--procs", "1", "--shard-cache-gb", repr(gb), "--batch-size", "8",
                         "--unit-batches", "2", "--image-size", "32", "--accel", "null", "--no-progress", "--json",
                         str(out), "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                         "--metrics-port", "-1", "--worker-metrics-port", "-1")
    finally:
        proxy.close()
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["samples"] == summary["unique_samples"] == 2 * sixteen.num_samples
    stages = summary["stage_seconds"]
    assert stages["read_wait"] > 2 * stages["cpu"], stages  # the reads waited on the store, not on a core
    assert summary["bottleneck"] == "storage", summary["bottleneck_detail"]
    assert "storage is the limit" in summary["bottleneck_detail"]
