"""stoker/protos/zap.py: only allow-listed keys connect, each named by its role, and every handshake is counted."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter
from zmq.utils import z85

from stoker.protos.curve import CONSUMER, ClientKeys, ServerKeys, add_key, caller_of, init_keys
from stoker.protos.zap import KeyAuthenticator, count_handshakes, monitor_handshakes


@pytest.fixture
def keys(tmp_path):
    folder = init_keys(tmp_path / "keys")
    add_key(folder, "cpu-0")
    add_key(folder, "rank-0", role=CONSUMER)
    return folder


@pytest.fixture
def stranger(tmp_path, keys):
    """A key pair made in another folder, so allow-listed nowhere here, but with this service's server key."""
    other = init_keys(tmp_path / "other")
    add_key(other, "eve")
    (other / "server.key").write_bytes((keys / "server.key").read_bytes())
    return ClientKeys.load(other, "eve")


def test_the_allow_list_decides_and_names_the_connection(keys, stranger):
    ctx = zmq.asyncio.Context()
    try:
        auth = KeyAuthenticator(ctx, ServerKeys.load(keys))  # not started: its hooks alone
        worker, consumer = ClientKeys.load(keys, "cpu-0"), ClientKeys.load(keys, "rank-0", role=CONSUMER)
        assert auth.callback("stoker", worker.public) and auth.callback("stoker", consumer.public)
        assert not auth.callback("stoker", stranger.public)
        assert auth.curve_user_id(z85.decode(worker.public)) == "worker:cpu-0"
        assert auth.curve_user_id(z85.decode(consumer.public)) == "consumer:rank-0"
    finally:
        ctx.term()


async def _serve(keys, clients: list[ClientKeys | None], settled) -> tuple[list[str], dict[str, float]]:
    """A guarded ROUTER; each client (None: no key at all) says hello once. Returns the callers heard and
    the handshake counts once `settled(heard, counts)` holds (or after 10 s)."""
    ctx = zmq.asyncio.Context()
    auth = KeyAuthenticator(ctx, ServerKeys.load(keys))
    auth.start()
    outcomes = Counter("auth", "handshakes", ["result"], registry=CollectorRegistry())
    stop = threading.Event()
    router = ctx.socket(zmq.ROUTER)
    ServerKeys.load(keys).apply(router)
    counting = asyncio.ensure_future(count_handshakes(monitor_handshakes(router), outcomes, stop))
    port = router.bind_to_random_port("tcp://127.0.0.1")
    sockets = []
    for client in clients:
        sock = ctx.socket(zmq.DEALER)
        if client is not None:
            client.apply(sock)
        sock.connect(f"tcp://127.0.0.1:{port}")
        await sock.send(b"hello")
        sockets.append(sock)
    heard: list[str] = []

    def counts() -> dict[str, float]:
        return {s.labels["result"]: s.value for m in outcomes.collect() for s in m.samples if s.name == "auth_total"}

    deadline = asyncio.get_running_loop().time() + 10
    while not settled(heard, counts()) and asyncio.get_running_loop().time() < deadline:
        if await router.poll(50):
            frames = await router.recv_multipart(copy=False)
            heard.append(str(caller_of(frames[1]).role + ":" + caller_of(frames[1]).name))
    stop.set()
    await counting
    for sock in [*sockets, router]:
        sock.close(0)
    auth.stop()
    ctx.term()
    return heard, counts()


def test_a_listed_key_is_heard_under_its_role_and_others_never_are(keys, stranger):
    worker, consumer = ClientKeys.load(keys, "cpu-0"), ClientKeys.load(keys, "rank-0", role=CONSUMER)
    def settled(heard: list[str], counts: dict[str, float]) -> bool:
        return len(heard) == 2 and counts.get("refused", 0) >= 1 and counts.get("failed_handshake", 0) >= 1

    heard, counts = asyncio.run(_serve(keys, [worker, consumer, stranger, None], settled))
    assert sorted(heard) == ["consumer:rank-0", "worker:cpu-0"]  # the stranger and the keyless peer: nothing
    # the refused peers may try again (ZeroMQ reconnects), each try counted
    assert counts["admitted"] == 2 and counts["refused"] >= 1 and counts["failed_handshake"] >= 1
