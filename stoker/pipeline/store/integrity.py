"""Whether a shard file holds the bytes its manifest names (sha256), checked once per host.

Hashing reads the whole file: about 0.25 s of a core for a 256 MB shard (hashlib with SHA-NI
gives 0.9-1.2 GB/s here), where decoding its ~2,400 images takes about 2 s of a core (1,130
images/s per worker process here). Every worker process of a host opens every shard, so a check
in each process would cost a host of 16 processes twice the shard's decoding (and 16 reads of it
on a network file system). So the first process to check a file leaves a marker, named by the
file's path, size, mtime and inode, that holds the sha256 it matched; a process that opens the
same unchanged file later trusts the marker (one stat) instead of hashing again, and a file
written since (a new mtime or size) is hashed again. While one process hashes a file the others wait for its answer
(a lock per file) instead of hashing it too. Bytes changed without changing the size or the
mtime (bit rot, or a write that restored the mtime) go unseen until the file is next written.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from stoker.pipeline.store.locks import HeldLock, acquire
from stoker.protos.errors import DataError

log = logging.getLogger("stoker.shards")


class ShardRefused(DataError):
    """A shard that does not match its manifest: its samples are skipped. `kind` says what differs:
    sha256 (its bytes), rows (its row count) or schema (its columns)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def sha256_of(path: str | Path) -> str:
    """The file's SHA-256, hex (read in chunks, never whole into memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Markers:
    """The host's record of files found intact: one small file per (path, size, mtime, inode)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _marker(self, path: str | Path, st: os.stat_result) -> Path:
        key = f"{os.path.realpath(path)}\n{st.st_size}\n{st.st_mtime_ns}\n{st.st_ino}"
        return self.folder / hashlib.sha256(key.encode()).hexdigest()[:32]

    def matched(self, path: str | Path, sha256: str) -> bool:
        """True when `path`, as it is now, was found to hold `sha256` (no read of the file)."""
        try:
            return self._marker(path, os.stat(path)).read_text() == sha256
        except OSError:
            return False

    def mark(self, path: str | Path, sha256: str) -> None:
        """Record that `path`, as it is now, holds `sha256`; a folder that cannot be written means the
        next process hashes the file again, nothing worse."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            marker = self._marker(path, os.stat(path))
            partial = marker.with_name(f".{marker.name}.{os.getpid()}")
            partial.write_text(sha256)
            os.replace(partial, marker)
        except OSError as exc:
            log.debug("cannot record that %s was checked: %s", path, exc)

    def forget(self, path: str | Path) -> None:
        """Drop the record that the file was checked (it is being removed or replaced)."""
        try:
            self._marker(path, os.stat(path)).unlink(missing_ok=True)
        except OSError:
            pass

    def lock_path(self, path: str | Path) -> Path:
        """The lock file that makes one process per host hash this file, the others wait for it."""
        return self.folder / f"{self._marker(path, os.stat(path)).name}.lock"


def mismatch(path: str | Path, sha256: str, markers: Markers) -> str | None:
    """The sha256 the file's bytes have when it is not `sha256`; None when they match (or no sha256
    is given). Hashes the file once per host, as the module says."""
    if not sha256 or markers.matched(path, sha256):
        return None
    lock: HeldLock | None
    try:
        markers.folder.mkdir(parents=True, exist_ok=True)
        lock = acquire(markers.lock_path(path))
    except OSError as exc:  # no writable cache folder: check in this process alone
        log.debug("cannot lock %s's check: %s", path, exc)
        lock = None
    try:
        if markers.matched(path, sha256):  # another process checked it while we waited
            return None
        digest = sha256_of(path)
        if digest != sha256:
            return digest
        markers.mark(path, sha256)
        return None
    finally:
        if lock is not None:
            lock.release(remove=True)


def check_file(path: str | Path, sha256: str, markers: Markers) -> None:
    """Raise ShardRefused when the shard file at `path` does not hold `sha256`."""
    digest = mismatch(path, sha256, markers)
    if digest is not None:
        raise ShardRefused("sha256", f"shard {Path(path).name}: its bytes have sha256 {digest[:12]}, the manifest "
                                     f"says {sha256[:12]} (damaged or replaced)")
