"""protos/sockets.py: every socket carries the same guards, checked on real ZeroMQ sockets."""

import time

import pytest
import zmq

from protos.sockets import dealer, router


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
