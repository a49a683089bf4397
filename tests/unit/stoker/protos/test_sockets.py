"""stoker/protos/sockets.py: every socket carries the same guards, checked on real ZeroMQ sockets."""

import time

import pytest
import zmq

from stoker.protos.sockets import dealer, router, send_nowait


def test_a_message_over_the_cap_never_reaches_the_router(ctx):
    server = router(ctx, max_message_bytes=1000)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = dealer(ctx, "big", max_message_bytes=1000)
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"x" * 5000)  # the router drops the connection that sent it
    assert not server.poll(500)
    small = dealer(ctx, "small", max_message_bytes=1000)
    small.connect(f"tcp://127.0.0.1:{port}")
    small.send(b"hello")
    assert server.poll(2000) and server.recv_multipart() == [b"small", b"hello"]


def test_a_reply_to_a_peer_that_is_gone_raises_instead_of_vanishing(ctx):
    server = router(ctx, max_message_bytes=1000)
    server.bind_to_random_port("tcp://127.0.0.1")
    with pytest.raises(zmq.ZMQError):  # ROUTER_MANDATORY: EHOSTUNREACH
        server.send_multipart([b"nobody", b"reply"], flags=zmq.NOBLOCK)


def test_a_dealer_queues_nothing_for_an_endpoint_that_is_not_up(ctx):
    client = dealer(ctx, "early", max_message_bytes=1000)
    client.connect("tcp://127.0.0.1:1")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(zmq.Again):  # IMMEDIATE: no completed connection, so no queue
        client.send(b"lost?", flags=zmq.NOBLOCK)
    assert time.monotonic() - started < 1
    assert client.getsockopt(zmq.LINGER) == 0


def test_send_nowait_reports_an_unroutable_peer_from_a_plain_and_an_asyncio_socket(ctx):
    import asyncio

    import zmq.asyncio

    plain = router(ctx, max_message_bytes=1000)
    assert isinstance(send_nowait(plain, [b"nobody", b"reply"]), zmq.ZMQError)
    port = plain.bind_to_random_port("tcp://127.0.0.1")
    client = dealer(ctx, "known", max_message_bytes=1000)
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"hello")
    assert plain.poll(2000) and plain.recv_multipart() == [b"known", b"hello"]
    assert send_nowait(plain, [b"known", b"reply"]) is None and client.poll(2000) and client.recv() == b"reply"

    async def on_asyncio() -> BaseException | None:
        actx = zmq.asyncio.Context()
        try:
            sock = router(actx, max_message_bytes=1000)
            try:
                return send_nowait(sock, [b"nobody", b"reply"])
            finally:
                sock.close(0)
        finally:
            actx.term()

    assert isinstance(asyncio.run(on_asyncio()), zmq.ZMQError)
