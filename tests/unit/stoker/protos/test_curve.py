"""stoker/protos/curve.py: key folders, the role a key is admitted in, and who sent a frame."""

from __future__ import annotations

import stat

import pytest
import zmq

from stoker.protos.curve import (
    CONSUMER,
    NOBODY,
    WORKER,
    Caller,
    ClientKeys,
    KeyFileError,
    ServerKeys,
    add_key,
    caller_of,
    init_keys,
    is_loopback,
    list_keys,
    user_id,
)


@pytest.fixture
def keys(tmp_path):
    return init_keys(tmp_path / "keys")


def test_init_makes_a_private_server_key_and_never_replaces_it(keys):
    assert (keys / "server.key").exists()
    assert stat.S_IMODE((keys / "server.key_secret").stat().st_mode) == 0o600
    before = (keys / "server.key_secret").read_bytes()
    with pytest.raises(KeyFileError, match="already holds a server key"):
        init_keys(keys)
    assert (keys / "server.key_secret").read_bytes() == before
    assert list_keys(keys) == {"server": ["server.key"], "workers": [], "consumers": [], "jobs": [],
                               "secrets": []}


def test_a_key_is_admitted_in_the_role_of_its_allow_list(keys):
    secret = add_key(keys, "cpu-0")
    add_key(keys, "trainer_1", role=CONSUMER)
    assert secret == keys / "workers" / "cpu-0.key_secret" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert list_keys(keys) == {"server": ["server.key"], "workers": ["cpu-0"], "consumers": ["trainer_1"], "jobs": [],
                               "secrets": ["consumers/trainer_1.key_secret", "workers/cpu-0.key_secret"]}
    server = ServerKeys.load(keys)
    worker = ClientKeys.load(keys, "cpu-0")
    consumer = ClientKeys.load(keys, "trainer_1", role=CONSUMER)
    assert worker.server == consumer.server == server.public
    assert server.allowed == {worker.public: "worker:cpu-0", consumer.public: "consumer:trainer_1"}


@pytest.mark.parametrize(("name", "role", "error"), [
    ("cpu 0", WORKER, "use letters, digits"),
    ("../x", WORKER, "use letters, digits"),
    ("cpu-0", "admin", "role must be one of worker, consumer"),
])
def test_a_bad_name_or_role_is_refused(keys, name, role, error):
    with pytest.raises(KeyFileError, match=error):
        add_key(keys, name, role=role)
    assert list_keys(keys)["secrets"] == []


def test_one_name_holds_one_role(keys):
    add_key(keys, "cpu-0")
    with pytest.raises(KeyFileError, match="already allow-listed as a worker"):
        add_key(keys, "cpu-0", role=CONSUMER)


def test_keys_need_a_server_key_first(tmp_path):
    with pytest.raises(KeyFileError, match="no server key"):
        add_key(tmp_path, "cpu-0")
    with pytest.raises(KeyFileError, match="cannot read the key"):
        ServerKeys.load(tmp_path)


def test_a_public_key_alone_is_no_secret(keys):
    (keys / "workers" / "cpu-0.key_secret").write_bytes((keys / "server.key").read_bytes())  # public half only
    with pytest.raises(KeyFileError, match="holds no secret key"):
        ClientKeys.load(keys, "cpu-0")


def test_keys_are_applied_to_sockets(keys):
    add_key(keys, "cpu-0")
    ctx = zmq.Context()
    try:
        server_sock, client_sock = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        ServerKeys.load(keys).apply(server_sock)
        ClientKeys.load(keys, "cpu-0").apply(client_sock)
        assert server_sock.mechanism == client_sock.mechanism == zmq.CURVE
        assert server_sock.curve_server and not client_sock.curve_server and server_sock.zap_domain == b"stoker"
    finally:
        ctx.destroy(linger=0)


class _Frame:
    def __init__(self, user: str) -> None:
        self.user = user

    def get(self, name: str) -> str:
        assert name == "User-Id"
        return self.user


def test_the_caller_is_read_from_the_user_id_zap_gave():
    assert caller_of(_Frame(user_id(WORKER, "cpu-0"))) == Caller(WORKER, "cpu-0")
    assert caller_of(_Frame("consumer:rank-0")) == Caller(CONSUMER, "rank-0")
    assert caller_of(_Frame("admin:eve")) == NOBODY  # not a role: nobody in particular
    assert caller_of(b"plain bytes") == NOBODY


@pytest.mark.parametrize(("endpoint", "loopback"), [
    ("tcp://127.0.0.1:5561", True), ("tcp://127.3.2.1:1", True), ("tcp://[::1]:5561", True),
    ("tcp://localhost:5561", True), ("ipc:///tmp/x", True), ("inproc://x", True),
    ("tcp://10.0.0.5:5561", False), ("tcp://*:5561", False), ("tcp://0.0.0.0:5561", False),
    ("tcp://gpu-host:5561", False),
])
def test_loopback_is_what_provably_stays_on_this_machine(endpoint, loopback):
    assert is_loopback(endpoint) is loopback
