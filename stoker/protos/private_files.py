"""Files that no other local user can plant, read or swap: where a credential is kept on this machine.

The temp directory is shared by every user, so a name in it can be taken first by someone else
(a file to be adopted, a symbolic link to be written through, a directory to be written into).
Here a private file lives in a private directory ($XDG_RUNTIME_DIR, or TMPDIR/stoker-UID made
with mode 0700), is created under a random name with O_EXCL|O_NOFOLLOW and renamed into place,
and is trusted only when it is a regular file of this user with mode 0600 (checked on the open
descriptor, so it cannot be swapped between the check and the read).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from stoker.protos.errors import ConfigError

RUNTIME_ENV = "XDG_RUNTIME_DIR"


class PrivateFileError(ConfigError):
    """A file or directory that another user could have made or can read: not to be trusted."""


def private_dir() -> Path:
    """$XDG_RUNTIME_DIR when it is ours with mode 0700 (the login session's own), else
    TMPDIR/stoker-UID, made here with mode 0700 and refused when someone else holds that name."""
    runtime = os.environ.get(RUNTIME_ENV)
    if runtime and _problem_with_dir(Path(runtime)) is None:
        return Path(runtime)
    folder = Path(tempfile.gettempdir()) / f"stoker-{os.geteuid()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    check_private_dir(folder)
    return folder


def check_private_dir(folder: Path) -> None:
    """Refuse (one line, with the fix) a directory that is a link, not ours, or open to others."""
    problem = _problem_with_dir(folder)
    if problem is not None:
        raise PrivateFileError(f"{folder} {problem}: another user could plant or read the job secret there; "
                               f"remove it, or set $TMPDIR to a directory of your own")


def _problem_with_dir(folder: Path) -> str | None:
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"cannot be used ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    return _ownership_problem(st, 0o700)


def _ownership_problem(st: os.stat_result, mode: int) -> str | None:
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) != mode:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}"
    return None


def read_private(path: Path) -> str | None:
    """The text of `path`, or None when there is no such file. Refused (PrivateFileError) when it is a
    symbolic link, not a regular file, not ours, or readable or writable by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise PrivateFileError(f"{path} is a symbolic link: not trusted as a private file (remove it)") from exc
        raise PrivateFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        problem = "is not a regular file" if not stat.S_ISREG(st.st_mode) else _ownership_problem(st, 0o600)
        if problem is not None:
            fix = "chmod 600 it" if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode) else "remove it"
            raise PrivateFileError(f"{path} {problem}: another user could have written or read it, so it is "
                                   f"not trusted ({fix})")
        return f.read()


def write_private(path: Path, text: str) -> None:
    """Put `text` at `path` whole: written to a new file of a random name (mkstemp: O_EXCL|O_NOFOLLOW,
    mode 0600) beside it and renamed over `path`, so a reader sees the old file or the new one, never
    a half-written one, and a name planted in the directory is never written through."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
