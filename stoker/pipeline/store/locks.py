"""Advisory locks (fcntl.flock) that the processes of one host take on a file named for what they guard.

A holder of the exclusive lock may remove the lock file (the shard cache does, with the shard it
evicts): a process that was waiting on the removed file finds the path now names another file (or
none) and takes the lock again there, so two processes never both believe they hold it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Literal, overload


class HeldLock:
    """One flock held on an open lock file; released by `release()` (or when collected)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self, remove: bool = False) -> None:
        """`remove`: delete the lock file first (only under an exclusive lock: see the module's note)."""
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)  # closing the last descriptor of the open file releases the flock
        self._fd = None

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


@overload
def acquire(path: str | Path, exclusive: bool = True, wait: Literal[True] = True) -> HeldLock: ...


@overload
def acquire(path: str | Path, exclusive: bool = True, *, wait: bool) -> HeldLock | None: ...


def acquire(path: str | Path, exclusive: bool = True, wait: bool = True) -> HeldLock | None:
    """The lock on `path` (made if missing), shared or exclusive; None when `wait` is False and another
    open file holds a lock that conflicts (another process, or this one through another descriptor)."""
    path = Path(path)
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return HeldLock(path, fd)
        os.close(fd)  # removed (or replaced) by its holder while we waited: lock the file there now
