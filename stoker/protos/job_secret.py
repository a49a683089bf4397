"""The job credential: how a consumer proves itself to a dispatcher when there are no CURVE keys.

`stoker dispatch` makes a random secret with the job and writes it to a file only its owner
can read; every consumer of the job (one per data-parallel rank) attaches and acks with it,
read from that file or from $STOKER_JOB_SECRET. Workers never see it: the register reply
carries only what a worker needs. With CURVE keys the role comes from the key instead.

Whoever holds the secret acts as the job's consumer, so its file is private (protos.private_files):
by default in a directory only this user can enter, made and read only when it is this user's own
with mode 0600, so another local user can neither plant a secret for us to adopt nor take ours.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from stoker.protos.errors import ConfigError
from stoker.protos.private_files import PrivateFileError, private_dir, read_private, write_private

ENV = "STOKER_JOB_SECRET"
SECRET_BYTES = 32


class JobSecretError(ConfigError):
    """No usable job credential."""


class UntrustedSecret(JobSecretError):
    """A secret file someone else could have planted or read: refused at once, never waited on."""


def load_or_create(path: str | Path) -> bytes:
    """The secret in `path`, made (mode 0600) when there is no file there yet."""
    path = Path(path)
    secret = _read_checked(path)
    return secret if secret is not None else write_new(path)


def write_new(path: Path) -> bytes:
    """A fresh secret, put in place whole (protos.private_files.write_private): a reader sees the old
    secret or the new one, never a missing or half-written file."""
    secret = secrets.token_hex(SECRET_BYTES)
    try:
        write_private(path, secret + "\n")
    except OSError as exc:
        raise JobSecretError(f"cannot write the job secret {path}: {exc.strerror or exc}") from exc
    return secret.encode()


def read(path: str | Path) -> bytes:
    secret = _read_checked(Path(path))
    if secret is None:
        raise JobSecretError(f"cannot read the job secret {path}: no such file")
    return secret


def _read_checked(path: Path) -> bytes | None:
    """The secret in `path` (None: no file), only from a file that is ours with mode 0600."""
    try:
        text = read_private(path)
    except PrivateFileError as exc:
        raise UntrustedSecret(f"job secret refused: {exc}") from None
    if text is None:
        return None
    secret = text.strip()
    if len(secret) < 32:
        raise JobSecretError(f"{path} does not hold a job secret (made by `stoker dispatch --job-secret {path}`)")
    return secret.encode()


def default_path(endpoint: str) -> Path:
    """Where the secret of the dispatcher on `endpoint`'s port is kept on this machine by default:
    ranks of one machine (torchrun, `stoker run --world-size`) find it there. In this user's private
    directory ($XDG_RUNTIME_DIR, else TMPDIR/stoker-UID), never in the shared temp directory."""
    port = endpoint.rsplit(":", 1)[-1]
    try:
        return private_dir() / f"stoker-job-{port}.secret"
    except PrivateFileError as exc:
        raise UntrustedSecret(f"job secret refused: {exc}") from None


def for_rank_zero(path: str | None, control_bind: str) -> bytes:
    """The secret rank 0 (whose process runs the dispatcher) gives its job: $STOKER_JOB_SECRET,
    else a fresh one written to `path` (default: `default_path`), replacing an old job's."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip().encode()
    target = Path(path) if path else default_path(control_bind)
    if path:
        secret = _read_checked(target)
        if secret is not None:
            return secret
    return write_new(target)  # replaces an old job's in one rename: its ranks retry until they read this one


def for_consumer(path: str | None, dispatcher: str = "", wait_s: float = 0.0) -> bytes:
    """A consumer's credential: $STOKER_JOB_SECRET, else the file (default: where rank 0 or
    `stoker dispatch` on this machine keeps it), waiting up to `wait_s` for it to be written.
    A file that is not private is refused at once (UntrustedSecret)."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip().encode()
    target = Path(path) if path else default_path(dispatcher)
    deadline = time.monotonic() + wait_s
    while True:
        secret = _read_checked(target)
        if secret is not None:
            return secret
        if time.monotonic() >= deadline:
            raise JobSecretError(f"attaching to a dispatcher without CURVE keys needs the job secret, and there is "
                                 f"none at {target}: pass --job-secret FILE (the file `stoker dispatch` or rank 0 "
                                 f"wrote) or set ${ENV}")
        time.sleep(0.1)
