"""CURVE keys for Stoker's sockets: who may connect, and encryption on every link.

`stoker keys init DIR` makes the service's key pair (DIR/server.key, DIR/server.key_secret)
and an empty allow-list (DIR/allowed/). `stoker keys add DIR NAME` makes a worker key pair
(DIR/workers/NAME.key, NAME.key_secret) and puts its public half in the allow-list. A worker
host needs only DIR/server.key and its own NAME.key_secret. Files are ZeroMQ certificates
written by pyzmq's zmq.auth, so czmq tools read them too.
"""

from __future__ import annotations

import ipaddress
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

SERVER = "server"
ZAP_DOMAIN = "stoker"


class KeyFileError(ValueError):
    """Missing or unreadable key files."""


def init_keys(folder: str | Path) -> Path:
    folder = Path(folder)
    if (folder / f"{SERVER}.key_secret").exists():
        raise KeyFileError(f"{folder} already holds a server key; refusing to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "allowed").mkdir(exist_ok=True)
    (folder / "workers").mkdir(exist_ok=True)
    _, secret = zmq.auth.create_certificates(folder, SERVER)
    Path(secret).chmod(0o600)
    return folder


def add_worker(folder: str | Path, name: str) -> Path:
    """A new worker key pair, allow-listed; the secret file to give to that host."""
    folder = Path(folder)
    if not (folder / f"{SERVER}.key").exists():
        raise KeyFileError(f"{folder}: no server key (run `stoker keys init {folder}` first)")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise KeyFileError(f"worker name {name!r}: use letters, digits, - and _")
    public, secret = zmq.auth.create_certificates(folder / "workers", name)
    Path(secret).chmod(0o600)
    shutil.copy(public, folder / "allowed" / f"{name}.key")
    return Path(secret)


def list_keys(folder: str | Path) -> dict[str, list[str]]:
    folder = Path(folder)
    return {"server": [p.name for p in folder.glob(f"{SERVER}.key")],
            "allowed": sorted(p.stem for p in (folder / "allowed").glob("*.key")),
            "worker_secrets": sorted(p.name for p in (folder / "workers").glob("*.key_secret"))}


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    allowed: frozenset[bytes]  # z85 public keys of admitted workers

    @classmethod
    def load(cls, folder: str | Path) -> ServerKeys:
        folder = Path(folder)
        public, secret = _load(folder / f"{SERVER}.key_secret")
        allowed = frozenset(zmq.auth.load_certificates(folder / "allowed")) if (folder / "allowed").is_dir() \
            else frozenset()
        return cls(public, secret, allowed)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.zap_domain = ZAP_DOMAIN.encode()


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, folder: str | Path, name: str) -> ClientKeys:
        folder = Path(folder)
        server, _ = _load(folder / f"{SERVER}.key", need_secret=False)
        public, secret = _load(folder / "workers" / f"{name}.key_secret")
        return cls(public, secret, server)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def as_tuple(self) -> tuple[bytes, bytes, bytes]:
        return self.public, self.secret, self.server


def _load(path: Path, need_secret: bool = True) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: cannot read the key ({exc})") from exc
    if need_secret and not secret:
        raise KeyFileError(f"{path}: holds no secret key")
    return public, secret or b""


def is_loopback(endpoint: str) -> bool:
    """True for tcp://127.x / [::1] / localhost endpoints and for ipc/inproc."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard: not provably loopback
