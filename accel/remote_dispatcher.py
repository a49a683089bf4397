"""The consumer's side of a dispatcher that runs as its own process (`stoker dispatch`).

The consumer attaches once (and gets the job and the key its lease tokens are checked with),
then acks completed units from its event loop. Both prove the consumer's role: with CURVE
keys by its consumer key, without by the job credential. Acks are retried until the
dispatcher answers, so a dispatcher that restarts from its journal loses none; an ack it
already holds is harmless. It answers `finished` once every unit of the job is done.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable

import zmq
import zmq.asyncio

from accel.dispatcher import DispatcherStats
from protos import stoker_pb2 as pb
from protos.curve import ClientKeys

log = logging.getLogger("stoker.consumer")


class NotAConsumer(PermissionError):
    """The dispatcher does not accept us as the job's consumer (wrong key or job secret)."""


def attach(endpoint: str, consumer_id: str, curve: ClientKeys | None, credential: bytes = b"",
           timeout_s: float = 60.0) -> tuple[pb.JobSpec, bytes]:
    """Ask the dispatcher for its job and lease key (retrying while it starts)."""
    from workers.control_client import ControlClient, DispatcherUnreachable

    ctx = zmq.Context()
    client = ControlClient(ctx, endpoint, consumer_id, curve=curve)
    try:
        reply = client.request(pb.ControlRequest(attach=pb.Attach(consumer_id=consumer_id), job_credential=credential),
                               give_up_after_s=timeout_s)
    except DispatcherUnreachable as exc:
        raise ConnectionError(f"no dispatcher at {endpoint}: {exc}") from exc
    finally:
        client.close()
        ctx.term()
    if reply.WhichOneof("kind") == "error":
        raise NotAConsumer(f"the dispatcher at {endpoint} refused to attach this consumer: {reply.error.message}")
    if reply.WhichOneof("kind") != "attached":
        raise ConnectionError(f"the dispatcher at {endpoint} did not give a job: {reply}")
    return reply.attached.job, reply.attached.lease_key


class RemoteAcks:
    """What the consumer needs of a dispatcher, when the dispatcher is elsewhere."""

    def __init__(self, endpoint: str, consumer_id: str, total_units: int, curve: ClientKeys | None,
                 credential: bytes = b"", done_before: frozenset[int] = frozenset()) -> None:
        self.endpoint = endpoint
        self.consumer_id = consumer_id
        self.total_units = total_units
        self.curve = curve
        self.credential = credential
        self._acked: set[int] = set(done_before)
        self._unsent: set[int] = set()
        self.finished = False
        self.on_finished: Callable[[], None] = lambda: None
        self._ids = itertools.count(1)

    def ack(self, unit_id: int) -> bool:
        self._unsent.add(unit_id)
        return True

    def done_units(self) -> list[int]:
        return sorted(self._acked | self._unsent)

    def stats(self) -> DispatcherStats:
        return DispatcherStats(pending=0, leased=0, done=len(self._acked), hosts_alive=0, releases=0)

    async def run(self, ctx: zmq.asyncio.Context, stop: threading.Event, reply_timeout_s: float = 2.0) -> None:
        """Send acks until the job is finished; a new connection attaches first (the dispatcher
        takes acks only from its attached consumer, and a restarted one has none yet)."""
        sock = None
        while not stop.is_set() and not self.finished:
            if not self._unsent:
                await asyncio.sleep(0.02)
                continue
            if sock is None:
                sock = self._socket(ctx)
                attached = await self._call(sock, pb.ControlRequest(attach=pb.Attach(consumer_id=self.consumer_id)),
                                            reply_timeout_s)
                if attached is None:
                    sock.close(0)
                    sock = None
                    continue
            batch = sorted(self._unsent)
            reply = await self._call(sock, pb.ControlRequest(ack=pb.Ack(unit_ids=batch)), reply_timeout_s)
            if reply is None:
                sock.close(0)
                sock = None
                continue
            self._unsent -= set(batch)
            self._acked |= set(batch)
            if reply.WhichOneof("kind") == "finished":
                self.finished = True
                self.on_finished()
        if sock is not None:
            sock.close(0)

    async def _call(self, sock: zmq.asyncio.Socket, request: pb.ControlRequest,
                    timeout_s: float) -> pb.ControlReply | None:
        """One request and its reply; None when the dispatcher does not answer in time."""
        request.request_id = next(self._ids)
        request.job_credential = self.credential
        await sock.send(request.SerializeToString())
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if not await sock.poll(int(left * 1000)):
                break
            reply = pb.ControlReply()
            reply.ParseFromString(await sock.recv())
            if reply.request_id == request.request_id:
                if reply.WhichOneof("kind") == "error":
                    raise NotAConsumer(f"the dispatcher at {self.endpoint} refused this consumer: "
                                       f"{reply.error.message}")
                return reply
        log.warning("the dispatcher at %s did not answer; retrying", self.endpoint)
        return None

    def _socket(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        sock.setsockopt_string(zmq.IDENTITY, self.consumer_id)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.endpoint)
        return sock
