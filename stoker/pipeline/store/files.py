"""Writing files so that a crash, or a disk that fills up part-way, never leaves a half-written one.

A write goes to a temporary file beside the target, is fsynced, then renamed over it: a reader
sees the old file or the new one. A write the system refuses (a full disk, a quota, a read-only
folder) removes the temporary file, leaves the old file as it was, and raises one ResourceError
that names the file and what to do ("[Errno 28] No space left on device" alone names neither).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from stoker.protos.errors import ResourceError

_FULL = (errno.ENOSPC, errno.EDQUOT)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)


def write_atomically(path: str | Path, text: str, what: str = "file", elsewhere: str = "write it elsewhere") -> None:
    """Write `text` (UTF-8) to `path` whole or not at all. `what` names the file in an error ("checkpoint")
    and `elsewhere` says how to put it somewhere else ("pass --checkpoint elsewhere")."""
    data = text.encode()
    replace_atomically(path, lambda f: f.write(data), what, elsewhere)


def replace_atomically(path: str | Path, write: Callable[[BinaryIO], object], what: str = "file",
                       elsewhere: str = "write it elsewhere") -> None:
    """`write` fills a temporary binary file beside `path`, which is fsynced and renamed over `path`
    (for writers that take a file: torch.save). The system's refusal: `refused`'s ResourceError."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)  # what a full disk let through is no file to leave behind
        raise refused(exc, path, what, elsewhere) from exc
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: Path) -> None:
    """The temporary file gone, if it can be: a folder that refused the write may refuse this too."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def refused(exc: OSError, path: str | Path, what: str = "file",
            elsewhere: str = "write it elsewhere") -> ResourceError:
    """One line for a write the system refused: the file, the system's reason in words, and what to do
    ("cannot write checkpoint /x/ck.json: no space left on device (free space there or pass
    --checkpoint elsewhere)")."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    reason = reason[:1].lower() + reason[1:]
    if exc.errno in _FULL:
        fix = f"free space there or {elsewhere}"
    elif exc.errno in _REFUSED:
        fix = f"make its folder writable or {elsewhere}"
    else:
        fix = elsewhere
    error = ResourceError(f"cannot write {what} {path}: {reason} ({fix})")
    error.errno = exc.errno  # for a caller that tells a full disk from the rest; str() stays the one line
    return error
