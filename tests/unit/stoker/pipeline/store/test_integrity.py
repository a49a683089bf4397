"""stoker/pipeline/store/integrity.py: a shard file checked against its sha256, once per host."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os

import pytest

import stoker.pipeline.store.integrity as integrity
from stoker.pipeline.store.integrity import Markers, ShardRefused, check_file, mismatch


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "train-00000.arrow"
    path.write_bytes(os.urandom(1 << 20))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_found_intact_is_not_hashed_again_until_it_is_written(shard, tmp_path, monkeypatch):
    path, sha = shard
    markers = Markers(tmp_path / "verified")
    assert mismatch(path, sha, markers) is None
    monkeypatch.setattr(integrity, "sha256_of", lambda _: pytest.fail("hashed again"))
    assert mismatch(path, sha, markers) is None  # the marker: one stat
    monkeypatch.undo()
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))  # a new mtime: hashed again
    assert mismatch(path, sha, markers) == hashlib.sha256(data).hexdigest()


def test_a_mismatch_is_refused_naming_the_shard(shard, tmp_path):
    path, sha = shard
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ShardRefused, match="shard train-00000.arrow: its bytes have sha256") as refused:
        check_file(path, sha, Markers(tmp_path / "verified"))
    assert refused.value.kind == "sha256"
    check_file(path, "", Markers(tmp_path / "verified"))  # no sha256 in the manifest: nothing to check


def test_without_a_writable_marker_folder_each_check_hashes(shard, tmp_path):
    path, sha = shard
    (tmp_path / "file").write_text("")
    markers = Markers(tmp_path / "file" / "verified")  # cannot be made
    assert mismatch(path, sha, markers) is None and not markers.matched(path, sha)


def _check(path, sha, folder, log, barrier) -> None:
    real = integrity.sha256_of

    def counted(p):
        with open(log, "a") as f:
            f.write("hashed\n")
        return real(p)

    integrity.sha256_of = counted
    barrier.wait()
    assert mismatch(path, sha, Markers(folder)) is None


def test_processes_checking_one_file_at_once_hash_it_once(shard, tmp_path):
    path, sha = shard
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(3)
    log = tmp_path / "hashes.log"
    procs = [ctx.Process(target=_check, args=(path, sha, tmp_path / "verified", log, barrier)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert log.read_text().count("hashed") == 1
