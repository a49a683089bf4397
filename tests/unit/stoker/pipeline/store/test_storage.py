"""stoker/pipeline/store/storage.py: URIs, and a fetch that hashes what it writes."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from stoker.pipeline.store.storage import StorageError, copy_hashed, file_size, is_remote, join, read_bytes


class Recording(io.BytesIO):
    """An output that remembers the size of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, data) -> int:
        self.writes.append(len(data))
        return super().write(data)


def test_a_copy_is_hashed_chunk_by_chunk_as_it_is_written(tmp_path):
    data = os.urandom(100_000)
    (tmp_path / "shard").write_bytes(data)
    out = Recording()
    digest, copied = copy_hashed(f"file://{tmp_path}/shard", out, chunk_bytes=30_000)
    assert digest == hashlib.sha256(data).hexdigest() and copied == len(data) and out.getvalue() == data
    assert out.writes == [30_000, 30_000, 30_000, 10_000]  # streamed: never the whole file in memory


def test_sizes_and_missing_files(tmp_path):
    (tmp_path / "shard").write_bytes(b"x" * 123)
    assert file_size(f"file://{tmp_path}/shard") == 123
    with pytest.raises(FileNotFoundError):
        file_size(f"file://{tmp_path}/none")
    with pytest.raises(FileNotFoundError):
        copy_hashed(f"file://{tmp_path}/none", io.BytesIO())
    with pytest.raises(StorageError, match="no-such-scheme"):
        read_bytes("no-such-scheme://x/y")


def test_remote_uris_and_joins():
    assert is_remote("s3://bucket/x") and not is_remote("/data/x") and not is_remote("file:///data/x")
    assert join("s3://bucket/set/", "manifest.json") == "s3://bucket/set/manifest.json"
    assert join("/data/set", "manifest.json") == "/data/set/manifest.json"
