"""The job credential: how a consumer proves itself to a dispatcher when there are no CURVE keys.

`stoker dispatch` makes a random secret with the job and writes it to a file only its owner
can read; every consumer of the job (one per data-parallel rank) attaches and acks with it,
read from that file or from $STOKER_JOB_SECRET. Workers never see it: the register reply
carries only what a worker needs. With CURVE keys the role comes from the key instead.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from pathlib import Path

ENV = "STOKER_JOB_SECRET"
SECRET_BYTES = 32


class JobSecretError(ValueError):
    """No usable job credential."""


def load_or_create(path: str | Path) -> bytes:
    """The secret in `path`, made (mode 0600) when the file does not exist yet."""
    path = Path(path)
    if path.exists():
        return read(path)
    return write_new(path)


def write_new(path: Path) -> bytes:
    """A fresh secret, put in place whole: written to a new file of a random name (O_EXCL, mode 0600)
    and renamed over `path`, so a reader sees the old secret or the new one, never a missing or
    half-written file."""
    secret = secrets.token_hex(SECRET_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return secret.encode()


def read(path: str | Path) -> bytes:
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise JobSecretError(f"cannot read the job secret {path}: {exc.strerror or exc}") from exc
    if len(secret) < 32:
        raise JobSecretError(f"{path} does not hold a job secret (made by `stoker dispatch --job-secret {path}`)")
    return secret.encode()


def default_path(endpoint: str) -> Path:
    """Where the secret of the dispatcher on `endpoint`'s port is kept on this machine by default:
    ranks of one machine (torchrun, `stoker run --world-size`) find it there."""
    port = endpoint.rsplit(":", 1)[-1]
    return Path(tempfile.gettempdir()) / f"stoker-job-{port}.secret"


def for_rank_zero(path: str | None, control_bind: str) -> bytes:
    """The secret rank 0 (whose process runs the dispatcher) gives its job: $STOKER_JOB_SECRET,
    else a fresh one written to `path` (default: `default_path`), replacing an old job's."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip().encode()
    target = Path(path) if path else default_path(control_bind)
    if path and target.exists():
        return read(target)
    return write_new(target)  # replaces an old job's in one rename: its ranks retry until they read this one


def for_consumer(path: str | None, dispatcher: str = "", wait_s: float = 0.0) -> bytes:
    """A consumer's credential: $STOKER_JOB_SECRET, else the file (default: where rank 0 or
    `stoker dispatch` on this machine keeps it), waiting up to `wait_s` for it to be written."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip().encode()
    target = Path(path) if path else default_path(dispatcher)
    deadline = time.monotonic() + wait_s
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not target.exists():
        raise JobSecretError(f"attaching to a dispatcher without CURVE keys needs the job secret, and there is none "
                             f"at {target}: pass --job-secret FILE (the file `stoker dispatch` or rank 0 wrote) "
                             f"or set ${ENV}")
    return read(target)
