"""stoker/pipeline/store/shard_cache.py: remote shards fetched once per host, checked, and kept under a limit.

A `file://` URI stands in for the object store (pipeline.store.storage reads both through pyarrow.fs);
tests/integration/test_object_storage.py runs the same paths against a real S3-protocol server.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import threading
import time

import pytest

import stoker.pipeline.store.shard_cache as shard_cache
from stoker.pipeline.store.integrity import ShardRefused
from stoker.pipeline.store.shard_cache import CacheConfig, ShardCache, parse_gb

SHARD = 256 << 10


@pytest.fixture
def store(tmp_path):
    """Six 'remote' shards: uri -> sha256."""
    folder = tmp_path / "store"
    folder.mkdir()
    shards = {}
    for i in range(6):
        data = os.urandom(SHARD)
        (folder / f"train-{i:05d}.arrow").write_bytes(data)
        shards[f"file://{folder}/train-{i:05d}.arrow"] = hashlib.sha256(data).hexdigest()
    return shards


def _cache(tmp_path, shards: float | None = None) -> ShardCache:
    return ShardCache(CacheConfig(tmp_path / "cache", None if shards is None else int(shards * SHARD)))


def test_a_shard_is_fetched_once_then_mapped_from_the_cache(store, tmp_path):
    uri, sha = next(iter(store.items()))
    cache = _cache(tmp_path)
    first = cache.open(uri, sha)
    first.release()
    again = cache.open(uri, sha)
    assert again.path == first.path and again.path.read_bytes() == open(uri[7:], "rb").read()
    assert cache.events == {"fetched": 1}
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == [first.path.name]


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_copy_is_fetched_again(store, tmp_path, damage):
    uri, sha = next(iter(store.items()))
    cache = _cache(tmp_path)
    path = cache.open(uri, sha).path
    with open(path, "r+b") as f:
        if damage == "flipped":
            f.seek(SHARD // 2)
            f.write(b"\xff\x00\xff")
        else:
            f.truncate(SHARD // 3)
    copy = cache.open(uri, sha)
    assert hashlib.sha256(copy.path.read_bytes()).hexdigest() == sha
    assert cache.events == {"fetched": 2, "damaged": 1}


def test_a_shard_replaced_in_the_store_is_fetched_twice_then_refused(store, tmp_path):
    uri, sha = next(iter(store.items()))
    with open(uri[7:], "r+b") as f:
        f.write(b"replaced")
    cache = _cache(tmp_path, shards=4)
    with pytest.raises(ShardRefused, match="shard train-00000.arrow: fetched bytes have sha256") as refused:
        cache.open(uri, sha)
    assert refused.value.kind == "sha256" and cache.events == {"fetch_mismatch": 2}
    assert cache.usage() == 0  # nothing of it kept, no partial file left


def test_bytes_damaged_on_the_way_once_are_fetched_again(store, tmp_path, monkeypatch):
    uri, sha = next(iter(store.items()))
    real = shard_cache.copy_hashed
    calls = []

    def once_damaged(source, out, *args):
        calls.append(source)
        digest, copied = real(source, out, *args)
        return ("0" * 64 if len(calls) == 1 else digest), copied

    monkeypatch.setattr(shard_cache, "copy_hashed", once_damaged)
    cache = _cache(tmp_path)
    cache.open(uri, sha)
    assert len(calls) == 2 and cache.events == {"fetch_mismatch": 1, "fetched": 1}


def test_least_recently_used_goes_first_and_an_open_copy_never(store, tmp_path):
    uris = list(store)
    cache = _cache(tmp_path, shards=2)
    a = cache.open(uris[0], store[uris[0]])
    cache.open(uris[1], store[uris[1]]).release()
    time.sleep(0.01)  # recency is the access time: the clock must move past the file system's granularity
    cache.open(uris[2], store[uris[2]]).release()  # a is open: 1 goes
    assert a.path.exists() and cache.events["evicted"] == 1
    assert sorted(p.name[-17:] for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")) == \
        ["train-00000.arrow", "train-00002.arrow"]
    a.release()
    time.sleep(0.01)  # as above: a later access time
    cache.open(uris[2], store[uris[2]]).release()  # used now: 0 is the least recent
    cache.open(uris[3], store[uris[3]]).release()
    assert not a.path.exists() and cache.usage() <= 2 * SHARD


@pytest.mark.parametrize("limit", [2, None])
def test_a_partial_file_of_a_fetch_that_died_is_removed(store, tmp_path, limit):
    cache = _cache(tmp_path, shards=limit)
    (tmp_path / "cache" / ".partial").mkdir(parents=True)
    (tmp_path / "cache" / ".partial" / "dead-train-00009.arrow").write_bytes(b"x" * SHARD)
    uri = next(iter(store))
    cache.open(uri, store[uri]).release()
    assert not (tmp_path / "cache" / ".partial" / "dead-train-00009.arrow").exists()


def test_limits_are_positive_numbers(tmp_path, monkeypatch):
    assert parse_gb("1.5") == 1.5
    for bad in ("0", "-1", "x", "inf", "nan", "1e300"):
        with pytest.raises(ValueError, match="must be a number > 0"):
            parse_gb(bad)
    monkeypatch.setenv("STOKER_SHARD_CACHE", str(tmp_path))
    monkeypatch.setenv("STOKER_SHARD_CACHE_GB", "0.5")
    assert CacheConfig.from_env() == CacheConfig(tmp_path, 1 << 29)
    assert CacheConfig.from_env(2.0).limit_bytes == 2 << 30  # the flag wins


def _open_all(folder, limit, uris, shas, barrier, results) -> None:
    cache = ShardCache(CacheConfig(folder, limit))
    barrier.wait(timeout=60)
    for uri, sha in zip(uris, shas, strict=True):
        copy = cache.open(uri, sha)
        assert hashlib.sha256(copy.path.read_bytes()).hexdigest() == sha
        copy.release()
    results.put(dict(cache.events))


def _two_processes(tmp_path, limit, first: list[str], second: list[str], store,
                   watch: ShardCache | None = None) -> tuple[list[dict], int]:
    """Two forked processes opening their shards at once: each one's events, and with `watch`, the most
    bytes that cache held meanwhile. The watcher starts after the forks, so no child inherits a lock
    its usage() holds for a moment (a flock belongs to the open file, which a fork shares)."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_open_all, args=(tmp_path / "cache", limit, uris, [store[u] for u in uris], barrier,
                                                 results)) for uris in (first, second)]
    for proc in procs:
        proc.start()
    most, done = [0], threading.Event()

    def watcher() -> None:
        while watch is not None and not done.is_set():
            most[0] = max(most[0], watch.usage())

    thread = threading.Thread(target=watcher)
    thread.start()
    try:
        barrier.wait(timeout=60)
        events = [results.get(timeout=60) for _ in procs]
    finally:
        done.set()
        thread.join(timeout=10)
        for proc in procs:
            proc.join(10)
    assert [p.exitcode for p in procs] == [0, 0]
    return events, most[0]


def test_two_processes_wanting_one_shard_at_once_fetch_it_once(store, tmp_path):
    uri = next(iter(store))
    events, _ = _two_processes(tmp_path, None, [uri], [uri], store)
    assert sum(e.get("fetched", 0) for e in events) == 1


def test_two_processes_fetching_at_once_keep_the_cache_under_its_limit(store, tmp_path, capfd):
    uris = list(store)
    cache = _cache(tmp_path, shards=2)
    events, most = _two_processes(tmp_path, cache.cfg.limit_bytes, uris[:3] + uris[:3], uris[3:] + uris[3:], store,
                                  watch=cache)
    assert sum(e.get("fetched", 0) for e in events) >= 6 and sum(e.get("evicted", 0) for e in events) >= 4
    assert 0 < most <= 2 * SHARD and cache.usage() <= 2 * SHARD
    # no count saw a fetch twice (as a partial file and as the copy it was renamed to) and evicted for it
    assert "over its limit" not in capfd.readouterr().err
