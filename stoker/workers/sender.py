"""A worker process's data connection to one consumer rank: hello, credit, zero-copy sends.

IMMEDIATE is set, so while the consumer is not up a send fails at once instead of queueing;
the sender repeats its hello with back-off and never piles batches up. The hello and every
batch carry the token of the lease the process works under (`lease`); a consumer that does
not accept it says so (`LeaseRefused`: drop the unit, lease another). The process never
blocks on one sender: it polls all of its senders' sockets together (workers.process) and
calls `hear` on each, which takes credit, answers pings and repeats hellos that are due.
`silent_s` says how long the consumer has said nothing at all: a live consumer pings a
sender that waits for credit every few seconds, so a long silence means it is gone.

A batch is sent only while the rank's connection is up (IMMEDIATE: a DEALER with no connected
peer cannot take a message). Credit held from a rank that has since died would otherwise block
the send for ever, so a send waits at most SEND_DEADLINE_S for the connection and then raises
`SendTimedOut`: the process hands the unit back (the restarted rank gets it from a new lease).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys
from stoker.protos.errors import PeerError
from stoker.protos.sockets import dealer

if TYPE_CHECKING:
    from typing_extensions import Buffer

REHELLO_S = 5.0  # a welcomed sender without credit says hello again this often
SEND_DEADLINE_S = 10.0  # a batch that cannot leave this long (the rank's connection is gone): hand the unit back
SEND_POLL_MS = 100  # while waiting to send, how often the caller's stop flag is looked at


class Rejected(PeerError):
    """The consumer serves another job: this process cannot work for it."""


class LeaseRefused(PeerError):
    """The consumer does not accept the lease (it restarted, or the lease was lost): drop the unit."""


class SendTimedOut(LeaseRefused):
    """A batch could not be sent within the deadline: the rank's connection is gone (it died, or
    restarted elsewhere). The unit goes back to the dispatcher."""


@dataclass(frozen=True)
class Lease:
    """The unit a worker process holds, and the token that proves it to the consumer."""

    unit_id: int
    token: bytes


COPY_BELOW = 1 << 20  # frames smaller than this are copied into the message, larger ones sent in place:
# a copy of a few hundred KB costs less than pyzmq's zero-copy bookkeeping, whose garbage-collector
# thread takes the GIL for every frame it frees (about 3% of a BERT worker's CPU, 4 frames a batch)


class DataSender:
    """One worker process's connection to one rank: hello, batches under the credit the rank
    grants, and the rank's replies (credit, pings, rejects)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, host_id: str, worker_id: str, job_id: str,
                 curve: ClientKeys | None = None) -> None:
        self.endpoint = endpoint
        self.host_id = host_id
        self.worker_id = worker_id
        self.job_id = job_id
        self.lease: Lease | None = None  # the unit being sent, set by the process for each unit
        self.active = False  # the process is sending `lease`'s unit now
        self.credit = 0
        self.bytes_sent = 0
        sock = dealer(ctx, worker_id, 1 << 16, curve, linger_ms=2000)  # replies are credits and rejects: tiny
        sock.copy_threshold = COPY_BELOW
        try:
            sock.connect(endpoint)
        except zmq.ZMQError:
            sock.close(0)  # an unclosed socket would hang the context's term()
            raise
        self.socket = sock
        self.welcomed = False  # the consumer answered our hello
        self._heard = time.monotonic()  # the consumer's last message (or the current unit's start)
        self._next_hello = 0.0
        self._backoff = 0.05

    def start_unit(self, lease: Lease) -> None:
        """The next unit goes to this consumer: say so at once, so that a consumer waiting for exactly
        this unit (it delivers in plan order) knows who makes it, and can grant credit for it."""
        self.lease = lease
        self.active = True
        self._heard = time.monotonic()  # its silence is counted from here
        self._backoff = 0.05
        self._hello()

    def end_unit(self) -> None:
        """The unit's last batch is sent (or the unit handed back): no more hellos for it."""
        self.active = False

    def _hello(self) -> None:
        lease = self.lease or Lease(0, b"")
        hello = pb.DataMessage(hello=pb.Hello(worker_id=self.worker_id, job_id=self.job_id, host_id=self.host_id,
                                              unit_id=lease.unit_id, lease_token=lease.token))
        try:
            self.socket.send(hello.SerializeToString(), flags=zmq.NOBLOCK)
        except zmq.Again:  # no connection yet; the next hello will try again
            pass

    def _read_replies(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                data = self.socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = pb.DataReply()
            try:
                reply.ParseFromString(data)
            except Exception:  # protobuf DecodeError: not from a Stoker consumer; ignore it
                continue
            self._heard = time.monotonic()
            kind = reply.WhichOneof("kind")
            if kind == "credit":
                self.credit += reply.credit.batches
                self.welcomed = True
            elif kind == "ping":
                self._pong()
            elif kind == "reject":
                self._rejected(reply.reject)

    def _pong(self) -> None:
        try:
            self.socket.send(pb.DataMessage(pong=pb.Pong()).SerializeToString(), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _rejected(self, reject: pb.Reject) -> None:
        if reject.code == "unknown_sender":  # the consumer freed our slot (or restarted): our credit is void
            self.credit = 0
            self.welcomed = False
            if not self.active:
                return  # nothing in hand; the next unit's hello makes us known again
            raise LeaseRefused(f"consumer at {self.endpoint} no longer knows this sender: {reject.reason}")
        if reject.code == "not_leaseholder":
            if not self.active or self.lease is None or reject.unit_id != self.lease.unit_id:
                return  # about a unit this process has already finished with
            raise LeaseRefused(f"consumer at {self.endpoint} refused the lease: {reject.reason}")
        raise Rejected(f"consumer at {self.endpoint} refused us: {reject.reason}")

    def hear(self) -> None:
        """Take every reply waiting (credit, pings, refusals) without blocking, and say hello again
        when one is due: with back-off until the consumer first answers, then every REHELLO_S
        while starved (a consumer that restarted from a checkpoint learns of us from a hello; one
        that knows us answers it with no new credit)."""
        self._read_replies(0)
        now = time.monotonic()
        if self.active and now >= self._next_hello and (self.credit <= 0 or not self.welcomed):
            self._hello()
            if self.welcomed:
                self._next_hello = now + REHELLO_S
            else:
                self._next_hello = now + self._backoff
                self._backoff = min(self._backoff * 2, 2.0)

    def silent_s(self) -> float:
        """Seconds since the consumer last said anything (since the current unit began, when never)."""
        return time.monotonic() - self._heard

    def send(self, header: pb.BatchHeader, frames: Sequence[Buffer], deadline_s: float = SEND_DEADLINE_S,
             should_stop: Callable[[], bool] = lambda: False) -> int:
        """Send one batch; the caller must hold credit. Frames go out without a copy. Waits at most
        `deadline_s` for the rank's connection (then `SendTimedOut`), less when `should_stop` says so.

        Returns the tensor bytes sent."""
        if self.credit <= 0:
            raise RuntimeError("send without credit")
        self._read_replies(0)  # answer pings, hear rejects, between batches too
        if self.lease is not None:
            header.lease_token = self.lease.token
        header.host_id = self.host_id
        message = pb.DataMessage(batch=header).SerializeToString()
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                self.socket.send_multipart([message, *frames], copy=False, flags=zmq.NOBLOCK)
                break
            except zmq.Again:  # no connected peer (IMMEDIATE), or its queue is full
                pass
            if time.monotonic() >= give_up or should_stop():
                raise SendTimedOut(f"a batch for {self.endpoint} could not be sent in {deadline_s:.0f} s: "
                                   "the rank's connection is gone (it stopped, or restarted elsewhere)")
            self.socket.poll(SEND_POLL_MS, zmq.POLLOUT)
        self.credit -= 1
        nbytes = sum(memoryview(f).nbytes for f in frames)
        self.bytes_sent += nbytes
        return nbytes

    def close(self) -> None:
        """Say goodbye (best effort) and close the socket."""
        try:
            self.socket.send(pb.DataMessage(bye=pb.Bye(worker_id=self.worker_id)).SerializeToString(),
                             flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.socket.close()
