"""CURVE keys for Stoker's sockets: who may connect, in which role, and encryption on every link.

`stoker keys init DIR` makes the service's key pair (DIR/server.key, DIR/server.key_secret)
and empty allow-lists. `stoker keys add DIR NAME` makes a worker key pair
(DIR/workers/NAME.key, NAME.key_secret) and puts its public half in the workers'
allow-list (DIR/allowed/); `--role consumer` makes a consumer's (DIR/consumers/,
DIR/allowed-consumers/), for a consumer that attaches to a separate `stoker dispatch`;
`--role job` a job's (DIR/jobs/, DIR/allowed-jobs/), for a job that registers with a fleet.
A key's role comes from the allow-list it is in, never from a message: the service's ZAP
handler names every admitted connection "ROLE:NAME" (ZeroMQ's User-Id), and each message
carries it. A host needs only DIR/server.key and its own NAME.key_secret. Files are ZeroMQ
certificates written by pyzmq's zmq.auth, so czmq tools read them too.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from stoker.protos.errors import ConfigError

SERVER = "server"
ZAP_DOMAIN = "stoker"
WORKER = "worker"
CONSUMER = "consumer"
JOB = "job"  # a job that registers with a fleet (`stoker fleet`): its rank 0, `stoker run` or `stoker dispatch`
ROLES = (WORKER, CONSUMER, JOB)
_ALLOWED = {WORKER: "allowed", CONSUMER: "allowed-consumers", JOB: "allowed-jobs"}  # public keys admitted by role
_SECRETS = {WORKER: "workers", CONSUMER: "consumers", JOB: "jobs"}  # each key pair, to hand to its host


class KeyFileError(ConfigError):
    """Missing or unreadable key files."""


KEY_NAME = re.compile(r"[\w-]+")  # a key's name: letters, digits, - and _ (its files are NAME.key)

def init_keys(folder: str | Path) -> Path:
    folder = Path(folder)
    if (folder / f"{SERVER}.key_secret").exists():
        raise KeyFileError(f"{folder} already holds a server key; refusing to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    for sub in (*_ALLOWED.values(), *_SECRETS.values()):
        (folder / sub).mkdir(exist_ok=True)
    _, secret = zmq.auth.create_certificates(folder, SERVER)
    Path(secret).chmod(0o600)
    return folder


def add_key(folder: str | Path, name: str, role: str = WORKER) -> Path:
    """A new key pair allow-listed in `role`; returns the secret file to give to that host."""
    folder = Path(folder)
    if role not in ROLES:
        raise KeyFileError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not (folder / f"{SERVER}.key").exists():
        raise KeyFileError(f"{folder}: no server key (run `stoker keys init {folder}` first)")
    if not isinstance(name, str) or not KEY_NAME.fullmatch(name):
        raise KeyFileError(f"key name {name!r}: use letters, digits, - and _")
    for other in ROLES:
        if (folder / _ALLOWED[other] / f"{name}.key").exists():
            raise KeyFileError(f"{folder}: {name!r} is already allow-listed as a {other}")
    (folder / _SECRETS[role]).mkdir(exist_ok=True)
    (folder / _ALLOWED[role]).mkdir(exist_ok=True)
    public, secret = zmq.auth.create_certificates(folder / _SECRETS[role], name)
    Path(secret).chmod(0o600)
    shutil.copy(public, folder / _ALLOWED[role] / f"{name}.key")
    return Path(secret)


def list_keys(folder: str | Path) -> dict[str, list[str]]:
    folder = Path(folder)
    return {"server": [p.name for p in folder.glob(f"{SERVER}.key")],
            **{f"{role}s": sorted(p.stem for p in (folder / _ALLOWED[role]).glob("*.key")) for role in ROLES},
            "secrets": sorted(f"{_SECRETS[role]}/{p.name}" for role in ROLES
                              for p in (folder / _SECRETS[role]).glob("*.key_secret"))}


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    allowed: dict[bytes, str]  # z85 public key -> the User-Id its connections get, "ROLE:NAME"

    @classmethod
    def load(cls, folder: str | Path) -> ServerKeys:
        folder = Path(folder)
        public, secret = _load(folder / f"{SERVER}.key_secret")
        allowed: dict[bytes, str] = {}
        for role in ROLES:
            for path in sorted((folder / _ALLOWED[role]).glob("*.key")):
                key, _ = _load(path, need_secret=False)
                allowed[key] = user_id(role, path.stem)
        return cls(public, secret, allowed)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.zap_domain = ZAP_DOMAIN.encode()


def user_id(role: str, name: str) -> str:
    return f"{role}:{name}"


@dataclass(frozen=True)
class Caller:
    """Who sent a message: the role and name of its CURVE key; both empty without keys."""

    role: str = ""
    name: str = ""


NOBODY = Caller()


def caller_of(frame: object) -> Caller:
    """The sender of a received frame, from the User-Id that ZAP gave its connection."""
    try:
        value = frame.get("User-Id")  # type: ignore[attr-defined]
    except (AttributeError, zmq.ZMQError):  # plain bytes, or a socket without ZAP
        return NOBODY
    role, _, name = str(value).partition(":")
    return Caller(role, name) if role in ROLES else NOBODY


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, folder: str | Path, name: str, role: str = WORKER) -> ClientKeys:
        folder = Path(folder)
        server, _ = _load(folder / f"{SERVER}.key", need_secret=False)
        public, secret = _load(folder / _SECRETS[role] / f"{name}.key_secret")
        return cls(public, secret, server)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


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
