"""A worker process's data connection to the consumer: hello, credit, zero-copy sends.

IMMEDIATE is set, so while the consumer is not up a send fails at once instead of queueing;
the sender retries its hello with back-off and never piles batches up. The hello and every
batch carry the token of the lease the process works under (`lease`); a consumer that does
not accept it says so (`LeaseRefused`: drop the unit, lease another). Pings are answered
whenever the sender reads its socket: between batches and all the time it waits for credit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from protos import stoker_pb2 as pb
from protos.curve import ClientKeys
from protos.sockets import dealer


class Rejected(ConnectionError):
    """The consumer serves another job: this process cannot work for it."""


class Starved(TimeoutError):
    """No credit came in the time given."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"no credit for {waited:.1f} s")
        self.waited = waited


class LeaseRefused(ConnectionError):
    """The consumer does not accept the lease (it restarted, or the lease was lost): drop the unit."""


@dataclass(frozen=True)
class Lease:
    unit_id: int
    token: bytes


class DataSender:
    def __init__(self, ctx: zmq.Context, endpoint: str, host_id: str, worker_id: str, job_id: str,
                 curve: ClientKeys | None = None) -> None:
        self.endpoint = endpoint
        self.host_id = host_id
        self.worker_id = worker_id
        self.job_id = job_id
        self.lease: Lease | None = None  # the unit being sent, set by the process for each unit
        self.credit = 0
        self.bytes_sent = 0
        sock = dealer(ctx, worker_id, 1 << 16, curve, linger_ms=2000)  # replies are credits and rejects: tiny
        try:
            sock.connect(endpoint)
        except zmq.ZMQError:
            sock.close(0)  # an unclosed socket would hang the context's term()
            raise
        self.socket = sock
        self._welcomed = False  # the consumer answered our hello

    def start_unit(self, lease: Lease) -> None:
        """The next unit goes to this consumer: say so at once, so that a consumer waiting for exactly
        this unit (it delivers in plan order) knows who makes it, and can grant credit for it."""
        self.lease = lease
        self._hello()

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
            kind = reply.WhichOneof("kind")
            if kind == "credit":
                self.credit += reply.credit.batches
                self._welcomed = True
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
            self._welcomed = False
            raise LeaseRefused(f"consumer at {self.endpoint} no longer knows this sender: {reject.reason}")
        if reject.code == "not_leaseholder":
            if self.lease is not None and reject.unit_id != self.lease.unit_id:
                return  # about a unit this process has already finished with
            raise LeaseRefused(f"consumer at {self.endpoint} refused the lease: {reject.reason}")
        raise Rejected(f"consumer at {self.endpoint} refused us: {reject.reason}")

    def wait_for_credit(self, should_stop: Callable[[], bool], rehello_after_s: float = 5.0,
                        give_up_after_s: float | None = None) -> float:
        """Block until a credit is held; returns seconds waited (Starved after `give_up_after_s`).

        Says hello until welcomed, and again every `rehello_after_s` while starved: a consumer
        that restarted (from a checkpoint) does not know us, and a hello is how it learns to
        grant credit. A consumer that does know us answers it with no new credit."""
        started = time.perf_counter()
        backoff = 0.05
        next_hello = time.monotonic() + (rehello_after_s if self._welcomed else 0.0)
        while self.credit <= 0 and not should_stop():
            if time.monotonic() >= next_hello:
                self._hello()
                if self._welcomed:
                    next_hello = time.monotonic() + rehello_after_s
                else:
                    next_hello = time.monotonic() + backoff
                    backoff = min(backoff * 2, 2.0)
            self._read_replies(100)
            if give_up_after_s is not None and time.perf_counter() - started > give_up_after_s:
                raise Starved(time.perf_counter() - started)
        return time.perf_counter() - started

    def idle(self, seconds: float) -> None:
        """Wait between units (no lease to be had yet) while answering pings: this sender is alive.
        A refusal heard now is about a unit already finished, or says the slot was freed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._read_replies(int(left * 1000))
            except LeaseRefused:
                continue

    def send(self, header: pb.BatchHeader, frames: list[object]) -> int:
        """Send one batch; the caller must hold credit. Frames go out without a copy.

        Returns the tensor bytes sent."""
        if self.credit <= 0:
            raise RuntimeError("send without credit")
        self._read_replies(0)  # answer pings, hear rejects, between batches too
        if self.lease is not None:
            header.lease_token = self.lease.token
        header.host_id = self.host_id
        message = pb.DataMessage(batch=header).SerializeToString()
        self.socket.send_multipart([message, *frames], copy=False)
        self.credit -= 1
        nbytes = sum(memoryview(f).nbytes for f in frames)
        self.bytes_sent += nbytes
        return nbytes

    def close(self) -> None:
        try:
            self.socket.send(pb.DataMessage(bye=pb.Bye(worker_id=self.worker_id)).SerializeToString(),
                             flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.socket.close()
