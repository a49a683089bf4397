"""The dispatcher's control socket: maps ControlRequest messages onto `Dispatcher` calls.

Requests carry an id; a retried request (the worker timed out waiting for the reply) gets
the cached reply instead of a second lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict

import zmq
import zmq.asyncio

from accel.dispatcher import Dispatcher
from accel.metrics import ConsumerMetrics
from accel.receiver import send_error
from protos import stoker_pb2 as pb
from protos.curve import ServerKeys
from protos.framing import MAX_HEADER_BYTES, frame_bytes

log = logging.getLogger("stoker.dispatcher")
MAX_NAME = 256  # longest host or worker id accepted
REPLY_CACHE_PEERS = 4096  # peers whose last reply is kept for retries; a flood of identities cannot grow it


class ControlServer:
    def __init__(self, socket: zmq.Socket, dispatcher: Dispatcher, job: pb.JobSpec,
                 metrics: ConsumerMetrics) -> None:
        self.socket = socket
        self.dispatcher = dispatcher
        self.job = job
        self.metrics = metrics
        self._last_reply: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
        self.consumer_peer: bytes | None = None  # only the attached consumer may ack units
        self.dropped: dict[str, int] = {}

    def handle(self, frames: list) -> None:
        peer = frame_bytes(frames[0])
        if len(frames) != 2 or len(frames[1]) > MAX_HEADER_BYTES:
            self._drop("bad_frames", peer)
            return
        request = pb.ControlRequest()
        try:
            request.ParseFromString(frame_bytes(frames[1]))
        except Exception:  # protobuf DecodeError
            self._drop("bad_header", peer)
            return
        kind = request.WhichOneof("kind")
        if kind is None or _too_long(getattr(request, kind)):
            self._drop("bad_header", peer)
            return
        cached = self._last_reply.get(peer)
        if cached and cached[0] == request.request_id:
            self._send(peer, cached[1])
            return
        if kind == "ack" and peer != self.consumer_peer:
            self._drop("not_consumer", peer)
            return
        if kind == "attach":
            self.consumer_peer = peer
        reply = self._answer(request)
        reply.request_id = request.request_id
        payload = reply.SerializeToString()
        self._last_reply[peer] = (request.request_id, payload)
        self._last_reply.move_to_end(peer)
        if len(self._last_reply) > REPLY_CACHE_PEERS:
            self._last_reply.popitem(last=False)
        self._send(peer, payload)
        self.update_gauges()

    def _answer(self, request: pb.ControlRequest) -> pb.ControlReply:
        d = self.dispatcher
        kind = request.WhichOneof("kind")
        if kind == "register":
            d.heartbeat(request.register.host_id)
            log.info("host %s registered with %d processes", request.register.host_id, request.register.procs)
            return pb.ControlReply(registered=pb.Registered(job=self.job))
        if kind == "heartbeat":
            d.heartbeat(request.heartbeat.host_id)
            return pb.ControlReply(finished=pb.Finished()) if d.finished else pb.ControlReply(ok=pb.Ok())
        if kind == "lease":
            if d.finished:
                return pb.ControlReply(finished=pb.Finished())
            unit = d.lease(request.lease.host_id, request.lease.worker_id, request.request_id)
            if unit is None:
                return pb.ControlReply(wait=pb.Wait(retry_after_s=0.2))
            return pb.ControlReply(unit=pb.WorkUnit(
                unit_id=unit.unit_id, epoch=unit.epoch, shard_index=unit.shard_index,
                start=unit.start, stop=unit.stop, first_sample_id=unit.first_sample_id))
        if kind == "attach":
            log.info("consumer %s attached", request.attach.consumer_id)
            return pb.ControlReply(registered=pb.Registered(job=self.job))
        if kind == "ack":
            for unit_id in request.ack.unit_ids:
                d.ack(unit_id)
            return pb.ControlReply(finished=pb.Finished()) if d.finished else pb.ControlReply(ok=pb.Ok())
        if kind == "release":
            r = request.release
            count = d.release(r.host_id, list(r.worker_ids) or None, r.reason or "released")
            log.info("host %s released %d units (%s)", r.host_id, count, r.reason)
            return pb.ControlReply(ok=pb.Ok())
        return pb.ControlReply(error=pb.Error(message=f"unknown request {kind}"))

    def tick(self) -> None:
        """Periodic: expire silent hosts."""
        for host in self.dispatcher.expire_hosts():
            log.warning("host %s missed its heartbeats; its units are re-leased", host)
        self.update_gauges()

    def update_gauges(self) -> None:
        stats = self.dispatcher.stats()
        self.metrics.units.labels(state="pending").set(stats.pending)
        self.metrics.units.labels(state="leased").set(stats.leased)
        self.metrics.units.labels(state="done").set(stats.done)
        self.metrics.workers_alive.set(stats.hosts_alive)

    def _send(self, peer: bytes, payload: bytes) -> None:
        error = send_error(self.socket.send_multipart([peer, payload], flags=zmq.NOBLOCK))
        if error is not None:
            log.info("control peer %r unreachable: %s", peer, error)

    def _drop(self, reason: str, peer: bytes) -> None:
        count = self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.metrics.control_dropped.labels(reason=reason).inc()
        if count <= 3 or count % 1000 == 0:
            log.warning("dropped a control message from %r: %s; %d so far", peer[:64], reason, count)


def _too_long(body: object) -> bool:
    """Names longer than MAX_NAME would let one peer grow the dispatcher's tables without bound."""
    names = [getattr(body, f, "") for f in ("host_id", "worker_id", "reason", "consumer_id")]
    names += list(getattr(body, "worker_ids", []))
    return any(len(n) > MAX_NAME for n in names if isinstance(n, str))


def control_router(ctx: zmq.asyncio.Context, keys: ServerKeys | None) -> zmq.asyncio.Socket:
    """The dispatcher's ROUTER: unroutable replies raise, small messages only, CURVE when keyed."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
    if keys is not None:
        keys.apply(sock)
    return sock


async def ticker(server: ControlServer, stop: threading.Event, period_s: float = 0.5) -> None:
    """Expire silent hosts and refresh gauges until `stop`."""
    while not stop.is_set():
        server.tick()
        await asyncio.sleep(period_s)
