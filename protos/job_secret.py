"""The job credential: how a consumer proves itself to a dispatcher when there are no CURVE keys.

`stoker dispatch` makes a random secret with the job and writes it to a file only its owner
can read; every consumer of the job (one per data-parallel rank) attaches and acks with it,
read from that file or from $STOKER_JOB_SECRET. Workers never see it: the register reply
carries only what a worker needs. With CURVE keys the role comes from the key instead.
"""

from __future__ import annotations

import os
import secrets
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
    secret = secrets.token_hex(SECRET_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")  # renamed into place whole: a reader never sees half
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    return secret.encode()


def read(path: str | Path) -> bytes:
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise JobSecretError(f"cannot read the job secret {path}: {exc.strerror or exc}") from exc
    if len(secret) < 32:
        raise JobSecretError(f"{path} does not hold a job secret (made by `stoker dispatch --job-secret {path}`)")
    return secret.encode()


def for_consumer(path: str | None) -> bytes:
    """A consumer's credential: $STOKER_JOB_SECRET, else the file."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip().encode()
    if not path:
        raise JobSecretError(f"attaching to a dispatcher without CURVE keys needs the job secret: pass "
                             f"--job-secret FILE (the file `stoker dispatch` wrote) or set ${ENV}")
    return read(path)
