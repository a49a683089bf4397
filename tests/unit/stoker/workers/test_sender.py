"""stoker/workers/sender.py: hello, credit and refusals, against a real ROUTER playing the consumer."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.workers.sender import SEND_DEADLINE_S, DataSender, Lease, LeaseRefused, SendTimedOut
from tests.helpers import wait_for


@pytest.fixture
def consumer_socket():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    yield ctx, router, f"tcp://127.0.0.1:{port}"
    router.close(0)
    ctx.destroy(linger=0)


def _next_message(router) -> tuple[bytes, pb.DataMessage, list[bytes]]:
    assert router.poll(5000)
    peer, first, *rest = router.recv_multipart()
    message = pb.DataMessage()
    message.ParseFromString(first)
    return peer, message, rest


def _say_hello(sender: DataSender, router) -> None:
    """Let the sender say hello until the consumer hears one: its first may go before the
    connection is up (IMMEDIATE drops it), and `hear` repeats it with back-off."""
    assert wait_for(lambda: sender.hear() or router.poll(0), timeout=5, interval=0.02)


def _credit(sender: DataSender) -> bool:
    sender.hear()
    return sender.credit > 0


def _reply(router, peer: bytes, reply: pb.DataReply) -> None:
    router.send_multipart([peer, reply.SerializeToString()])


def _read_through_a_ping(sender: DataSender, router, peer: bytes) -> None:
    """Ping the sender after the replies under test and hear until its pong comes back: it reads replies
    in the order they were sent, so by then it has read every one before the ping."""
    _reply(router, peer, pb.DataReply(ping=pb.Ping()))
    kinds: list[str] = []

    def ponged() -> bool:
        sender.hear()
        while router.poll(0):
            kinds.append(_next_message(router)[1].WhichOneof("kind"))
        return "pong" in kinds

    assert wait_for(ponged, timeout=5, interval=0.01), f"the sender never answered the ping: it sent {kinds}"


def _greeted(consumer_socket, host: str, lease: Lease) -> tuple[DataSender, bytes, pb.DataMessage]:
    """A sender working on `lease`, and its first hello as the consumer saw it."""
    ctx, router, endpoint = consumer_socket
    sender = DataSender(ctx, endpoint, host, f"{host}/p0.1", "job-1")
    sender.start_unit(lease)
    _say_hello(sender, router)
    peer, hello, _ = _next_message(router)
    return sender, peer, hello


def test_a_sender_says_hello_with_its_lease_and_sends_only_on_credit(consumer_socket):
    router = consumer_socket[1]
    sender, peer, hello = _greeted(consumer_socket, "host-a", Lease(7, b"token-7"))
    assert hello.WhichOneof("kind") == "hello" and peer == b"host-a/p0.1"
    with pytest.raises(RuntimeError, match="without credit"):
        sender.send(pb.BatchHeader(), [b"x"])
    _reply(router, peer, pb.DataReply(credit=pb.Credit(batches=2)))
    assert wait_for(lambda: _credit(sender), timeout=5, interval=0.01) and sender.welcomed
    frame = np.arange(1000, dtype=np.uint8)
    assert sender.send(pb.BatchHeader(batch_index=0), [frame]) == 1000
    _, batch, frames = _next_message(router)
    while batch.WhichOneof("kind") == "hello":  # the hellos it repeated while the connection came up
        _, batch, frames = _next_message(router)
    assert batch.batch.lease_token == b"token-7" and batch.batch.host_id == "host-a"
    assert frames == [frame.tobytes()] and sender.credit == 1
    sender.close()


def test_a_consumer_that_forgot_the_sender_voids_its_credit(consumer_socket):
    router = consumer_socket[1]
    sender, peer, _ = _greeted(consumer_socket, "h", Lease(1, b"t"))
    _reply(router, peer, pb.DataReply(credit=pb.Credit(batches=3)))
    assert wait_for(lambda: _credit(sender), timeout=5, interval=0.01)
    _reply(router, peer, pb.DataReply(reject=pb.Reject(code="unknown_sender", reason="restarted")))
    assert sender.socket.poll(5000)  # the refusal is in the sender's queue: its next send reads it first
    with pytest.raises(LeaseRefused, match="no longer knows this sender"):
        sender.send(pb.BatchHeader(), [b"x"])
    assert sender.credit == 0
    sender.close()


def test_a_refusal_about_a_finished_unit_is_not_news(consumer_socket):
    router = consumer_socket[1]
    sender, peer, _ = _greeted(consumer_socket, "h", Lease(4, b"t"))
    sender.end_unit()
    _reply(router, peer, pb.DataReply(reject=pb.Reject(code="not_leaseholder", reason="late", unit_id=4)))
    _reply(router, peer, pb.DataReply(reject=pb.Reject(code="unknown_sender", reason="freed")))
    _read_through_a_ping(sender, router, peer)  # neither refusal concerns a unit in hand: nothing is raised
    assert sender.credit == 0 and not sender.welcomed


def test_silence_is_counted_from_the_unit_start_and_ends_with_any_reply(consumer_socket):
    """A consumer that never answers is silent for as long as the unit has waited; any reply (a
    ping, as a live consumer sends to a waiting sender) ends the silence."""
    router = consumer_socket[1]
    sender, peer, _ = _greeted(consumer_socket, "h", Lease(1, b"t"))
    time.sleep(0.3)  # the consumer says nothing for 0.3 s: letting the time pass is the test
    sender.hear()
    assert sender.silent_s() >= 0.3 and sender.credit == 0
    _reply(router, peer, pb.DataReply(ping=pb.Ping()))
    assert wait_for(lambda: sender.hear() or sender.silent_s() < 0.2, timeout=5, interval=0.01)
    _, pong, _ = _next_message(router)
    while pong.WhichOneof("kind") == "hello":
        _, pong, _ = _next_message(router)
    assert pong.WhichOneof("kind") == "pong"
    sender.close()


def test_credit_from_a_rank_that_died_does_not_hold_the_send_for_ever(consumer_socket):
    """The rank grants credit and dies before the batch goes (a crashed job): the send gives up
    after its deadline with SendTimedOut (the unit goes back), where it used to block for ever."""
    ctx, router, _ = consumer_socket
    sender, peer, _ = _greeted(consumer_socket, "h", Lease(3, b"t"))
    _reply(router, peer, pb.DataReply(credit=pb.Credit(batches=4)))
    assert wait_for(lambda: _credit(sender), timeout=5, interval=0.01)
    router.close(0)  # the rank is gone; its credit is still in the sender's hands
    assert wait_for(lambda: not sender.socket.poll(0, zmq.POLLOUT), timeout=5, interval=0.01)
    started = time.monotonic()
    with pytest.raises(SendTimedOut, match="could not be sent in 1 s"):
        sender.send(pb.BatchHeader(), [b"x"], deadline_s=1.0)
    assert 0.9 <= time.monotonic() - started < 3.0
    stopping = time.monotonic()
    with pytest.raises(SendTimedOut):  # a process told to stop does not wait out the deadline
        sender.send(pb.BatchHeader(), [b"x"], should_stop=lambda: True)
    assert time.monotonic() - stopping < 1.0 and SEND_DEADLINE_S >= 5
    sender.close()
