"""workers/sender.py: hello, credit and refusals, against a real ROUTER playing the consumer."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from protos import stoker_pb2 as pb
from workers.sender import DataSender, Lease, LeaseRefused, Starved


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


def _say_hello(sender: DataSender) -> None:
    """Let the sender say hello: its first one may go before the connection is up (IMMEDIATE)."""
    try:
        sender.wait_for_credit(lambda: False, give_up_after_s=0.3)
    except Starved:
        pass


def _reply(router, peer: bytes, reply: pb.DataReply) -> None:
    router.send_multipart([peer, reply.SerializeToString()])


def _greeted(consumer_socket, host: str, lease: Lease) -> tuple[DataSender, bytes, pb.DataMessage]:
    """A sender working on `lease`, and its first hello as the consumer saw it."""
    ctx, router, endpoint = consumer_socket
    sender = DataSender(ctx, endpoint, host, f"{host}/p0.1", "job-1")
    sender.start_unit(lease)
    _say_hello(sender)
    peer, hello, _ = _next_message(router)
    return sender, peer, hello


def test_a_sender_says_hello_with_its_lease_and_sends_only_on_credit(consumer_socket):
    router = consumer_socket[1]
    sender, peer, hello = _greeted(consumer_socket, "host-a", Lease(7, b"token-7"))
    assert hello.WhichOneof("kind") == "hello" and peer == b"host-a/p0.1"
    with pytest.raises(RuntimeError, match="without credit"):
        sender.send(pb.BatchHeader(), [b"x"])
    _reply(router, peer, pb.DataReply(credit=pb.Credit(batches=2)))
    assert sender.wait_for_credit(lambda: False, give_up_after_s=5) < 5
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
    sender.wait_for_credit(lambda: False, give_up_after_s=5)
    _reply(router, peer, pb.DataReply(reject=pb.Reject(code="unknown_sender", reason="restarted")))
    time.sleep(0.3)  # the refusal is in the sender's queue: its next send reads it first
    with pytest.raises(LeaseRefused, match="no longer knows this sender"):
        sender.send(pb.BatchHeader(), [b"x"])
    assert sender.credit == 0
    sender.close()


def test_no_credit_in_time_is_starvation_not_a_hang(consumer_socket):
    ctx, _, endpoint = consumer_socket
    sender = DataSender(ctx, endpoint, "h", "h/p0.1", "job-1")
    sender.start_unit(Lease(1, b"t"))
    with pytest.raises(Starved):
        sender.wait_for_credit(lambda: False, give_up_after_s=0.3)
    sender.close()
