"""The dispatcher's control socket: maps ControlRequest messages onto `Dispatcher` calls.

Requests carry an id; a retried request (the worker timed out waiting for the reply) gets
the cached reply instead of a second lease.

A worker process that dies closes its connection, and the dispatcher hears it from the
socket's monitor: the units it leased are re-leased CLOSE_GRACE_S later, unless it has spoken
again by then on a new connection (a client that timed out reconnects at once). So a host
that is killed costs the job about a second, not the host timeout, which stays for the losses
nobody sees (a cut cable, a frozen machine).

Who may ask what (`AccessPolicy`): a worker registers, leases, heartbeats and releases; only
a consumer attaches and acks. With CURVE keys the role is the key's (its allow-list); without
keys anyone who reaches the socket may act as a worker, and a consumer must present the job
credential, which workers never see. When the consumer runs in the dispatcher's process it
acks directly, and the socket accepts no consumer at all. A refused request is dropped,
counted by reason and answered with an error that says why.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.fleet_member import Need
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.serving.connections import CLOSE_GRACE_S, Connections
from stoker.accel.control.serving.control_socket import bind_control, control_router, guarded_control
from stoker.accel.control.serving.host_ids import DAEMON_LIVE_BEATS, HostIds
from stoker.accel.control.serving.need_board import NEED_FRESH_S, NeedBoard
from stoker.accel.control.serving.rank_handlers import RankHandlers
from stoker.accel.control.serving.routing import (
    MAX_NAME,
    REPLY_CACHE_PEERS,
    Asked,
    Handler,
    ReplyCache,
    one_line,
    read_request,
    too_long,
)
from stoker.accel.control.serving.stall_report import StallReporter
from stoker.accel.control.serving.worker_handlers import MAX_QUERIED_UNITS, WorkerHandlers
from stoker.accel.control.watchdog import StallBounds, Watchdog
from stoker.protos import stoker_pb2 as pb
from stoker.protos.aio import pump_batches
from stoker.protos.control_client import MISDIRECTED
from stoker.protos.curve import CONSUMER, NOBODY, WORKER, Caller, caller_of
from stoker.protos.droplog import DropLog
from stoker.protos.leases import LeaseSigner
from stoker.protos.sockets import send_nowait
from stoker.protos.zap import count_handshakes

__all__ = ["CLOSE_GRACE_S", "CONNECTION_CLOSED", "DAEMON_LIVE_BEATS", "HANDLERS", "MAX_NAME", "MAX_QUERIED_UNITS",
           "NEED_FRESH_S", "REPLY_CACHE_PEERS", "AccessPolicy", "Asked", "ControlServer", "Handler", "bind_control",
           "control_router", "guarded_control", "one_line", "serve_control", "ticker"]

log = logging.getLogger("stoker.dispatcher")
CONNECTION_CLOSED = "connection_closed"  # the reason the units of a connection that stayed closed count under


@dataclass(frozen=True)
class AccessPolicy:
    keyed: bool  # CURVE: a caller's role is its key's
    consumer_secret: bytes | None = None  # without keys: the credential consumers attach and ack with
    remote_consumers: bool = False  # False: the consumer lives in this process and no peer may act as one

    def refusal(self, kind: str, caller: Caller, request: pb.ControlRequest) -> str | None:
        """The drop reason when `caller` may not send this request, else None."""
        handler = HANDLERS.get(kind)
        if handler is not None and handler.role == WORKER:
            return "not_worker" if self.keyed and caller.role != WORKER else None
        if not self.remote_consumers:
            return "not_consumer"
        if self.keyed:
            return None if caller.role == CONSUMER else "not_consumer"
        if self.consumer_secret and hmac.compare_digest(request.job_credential, self.consumer_secret):
            return None
        return "not_consumer"


_REFUSED = {"not_worker": "this key is not allow-listed as a worker",
            "not_consumer": "only the job's consumer may attach and ack (with keys: a consumer key; without: "
                            "the job secret of `stoker dispatch --job-secret`)"}


class ControlServer:
    """The control socket's I/O: requests read, routed to their handler (HANDLERS: accel.control.serving.worker_handlers
    and rank_handlers) and answered after one journal sync (group commit), the periodic tick, and the
    socket's monitor. What it knows is kept by I/O-free parts on the dispatcher's clock: connections,
    host-id ownership, the stall reporter and the need board."""

    def __init__(self, socket: zmq.Socket, dispatcher: Dispatcher, job: pb.JobSpec,
                 metrics: ControlMetrics, leases: LeaseSigner, access: AccessPolicy,
                 stall: StallBounds | None = None) -> None:
        self.socket = socket
        self.dispatcher = dispatcher
        self.job = job
        self.metrics = metrics
        self.leases = leases
        self.access = access
        self.replies = ReplyCache(REPLY_CACHE_PEERS)
        self._drops = DropLog(log, "a control message", metrics.control_dropped)
        self.dropped = self._drops.counts  # by reason
        self._outbox: list[tuple[bytes, bytes]] | None = None  # answers held until the journal is synced
        self._compactions_counted = 0
        self.on_failure: Callable[[str], None] = lambda reason: None  # the job failed: the consumer here stops
        # This run of the job: a job resumed in place keeps its id but not this, so what a daemon still
        # holds from the run before (processes, leases, connections to ranks that died) is told apart.
        self.run_id = secrets.token_hex(8)
        self.watchdog = Watchdog(stall or StallBounds(), dispatcher.clock)
        clock = self._now  # the dispatcher's clock, read at each call (a test may swap it)
        self.connections = Connections(clock)
        self.host_ids = HostIds(job.heartbeat_s if job.HasField("heartbeat_s") else 1.0, clock, REPLY_CACHE_PEERS)
        self.stalls = StallReporter(self.watchdog, metrics, clock)
        self.needs = NeedBoard(clock)
        self.workers = WorkerHandlers(dispatcher, job, self.run_id, metrics, leases, access.keyed, self.watchdog,
                                      self.host_ids, self.connections, self._fail)
        self.ranks = RankHandlers(dispatcher, job, leases, self.connections, self.needs, self.stalls)

    def _now(self) -> float:
        return self.dispatcher.clock()

    def handle(self, frames: list) -> None:
        self.handle_all([frames])

    def handle_all(self, batch: list[list]) -> None:
        """Answer a batch of requests read together: the journal is synced once, before any answer
        leaves (group commit), so every answer sent is durable."""
        self._outbox = []
        try:
            for frames in batch:
                self._handle_one(frames)
        finally:
            outbox, self._outbox = self._outbox, None
            if self.dispatcher.journal is not None and self.dispatcher.journal.sync():
                self.metrics.journal_group.observe(len(batch))
            for peer, payload in outbox:
                self._send(peer, payload)
            self.update_gauges()

    def _not_a_fleet(self, peer: bytes, request_id: int) -> None:
        """A fleet's request, sent here by a daemon or a job given this address as a fleet's: say what this is."""
        self._send(peer, pb.ControlReply(request_id=request_id, error=pb.Error(reason=MISDIRECTED, message=(
            f"this is job {self.job.job_id}'s dispatcher, not a fleet (stoker fleet): a worker of this job alone "
            "takes --dispatcher here, a fleet's worker and a job take --fleet at the fleet's address"))
        ).SerializeToString())

    def _handle_one(self, frames: list) -> None:
        read = read_request(frames, pb.ControlRequest, self._drop, self._spoke, self._not_a_fleet)
        if read is None:
            return
        peer, request, kind = read
        if too_long(getattr(request, kind)):
            self._drop("bad_header", peer)
            return
        caller = caller_of(frames[1]) if self.access.keyed else NOBODY
        refusal = self.access.refusal(kind, caller, request)
        if refusal is not None:
            self._drop(refusal, peer)
            self._send(peer, pb.ControlReply(request_id=request.request_id,
                                             error=pb.Error(message=_REFUSED[refusal])).SerializeToString())
            return
        asker = peer + b"\0" + caller.name.encode()  # a reply is only ever repeated to the key it was made for
        cached = self.replies.get(asker, request.request_id)
        if cached is not None:
            self._send(peer, cached)
            return
        reply = self._answer(request, caller, peer)
        reply.request_id = request.request_id
        payload = reply.SerializeToString()
        self.replies.put(asker, request.request_id, payload)
        self._send(peer, payload)

    def _answer(self, request: pb.ControlRequest, caller: Caller, peer: bytes) -> pb.ControlReply:
        """The reply of the request's handler (HANDLERS); a consumer's request before it attached is refused."""
        kind = request.WhichOneof("kind")
        handler = HANDLERS.get(kind or "")
        if handler is None:
            return pb.ControlReply(error=pb.Error(message=f"unknown request {kind}"))
        asked = Asked(request, caller, peer, self.connections.rank_of(peer))
        if handler.attached:
            if asked.rank is None:
                return pb.ControlReply(error=pb.Error(message="attach first"))
            self.dispatcher.liveness.rank_heard(*asked.rank)
        return handler.answer(self, asked)

    def redo_short(self, rank: int, unit_id: int) -> bool:
        """A unit `rank` got short, leased again unless its holder is transforming a sample of it
        (accel.control.serving.rank_handlers.RankHandlers.redo_short)."""
        return self.ranks.redo_short(rank, unit_id)

    def heard_need(self, rank: int, need: Need) -> None:
        """What `rank` measures now (its acks carry it; rank 0 in this process says it directly)."""
        self.needs.heard(rank, need)

    def job_need(self) -> Need:
        """The job's need for a fleet: its ranks' (heard within NEED_FRESH_S), summed."""
        return self.needs.total()

    def hosts_not_told(self) -> set[str]:
        """Live hosts whose daemon has not yet heard that the job is finished."""
        return self.workers.hosts_not_told()

    def _fail(self, line: str) -> None:
        """The job fails with `line`, everywhere it is watched: the log, the metric, every rank."""
        if self.dispatcher.fail(line):
            log.error("the job fails: %s", line)
            self.metrics.job_failed(line)
            self.on_failure(line)

    # ---- connections ---------------------------------------------------------------------
    def _spoke(self, peer: bytes, frame: object) -> None:
        """Which connection the peer spoke on (ZMQ_SRCFD of its message), so that its closing names it."""
        self.connections.spoke(peer, frame.get(zmq.SRCFD) if isinstance(frame, zmq.Frame) else None)

    def connection_event(self, event: Mapping[str, Any]) -> None:
        """From the socket's monitor: a connection closed (its peer is dead, or reconnecting)."""
        if event["event"] == zmq.EVENT_DISCONNECTED:
            self.connections.closed(event["value"])

    def tick(self) -> None:
        """Periodic: re-lease the units of closed connections, expire silent hosts, report ranks
        that went silent (their streams stall)."""
        for host_id, worker_id in self.connections.stayed_closed():
            count = self.dispatcher.release(host_id, [worker_id], CONNECTION_CLOSED)
            if count:
                log.warning("worker %s of host %s closed its connection: its %d unit(s) are re-leased",
                            worker_id, host_id, count)
        for host in self.dispatcher.expire_hosts():
            log.warning("host %s missed its heartbeats; its units are re-leased", host)
        self.stalls.silent(self.dispatcher.liveness.silent_ranks(), self.dispatcher.host_timeout_s,
                           self.dispatcher.rank_finished)
        failure = self.stalls.watch(self.dispatcher)
        if failure is not None:
            self._fail(failure)
        if self.dispatcher.journal is not None:
            self.dispatcher.journal.sync()  # the releases of expired hosts
        self.update_gauges()

    def update_gauges(self) -> None:
        journal = self.dispatcher.journal
        if journal is not None:
            self.metrics.journal_bytes.set(journal.size)
            self.metrics.journal_compactions.inc(journal.compactions - self._compactions_counted)
            self._compactions_counted = journal.compactions
        stats = self.dispatcher.stats()
        self.metrics.units.labels(state="pending").set(stats.pending)
        self.metrics.units.labels(state="leased").set(stats.leased)
        self.metrics.units.labels(state="done").set(stats.done)
        self.metrics.workers_alive.set(stats.hosts_alive)

    def _send(self, peer: bytes, payload: bytes) -> None:
        if self._outbox is not None:
            self._outbox.append((peer, payload))
            return
        error = send_nowait(self.socket, [peer, payload])
        if error is not None:
            log.info("control peer %r unreachable: %s", peer, error)

    def _drop(self, reason: str, peer: bytes) -> None:
        self._drops(reason, peer[:64])


# every kind of ControlRequest (stoker/protos/stoker.proto's oneof; a test checks the two agree)
HANDLERS: dict[str, Handler[ControlServer, pb.ControlReply]] = {
    "register": Handler(lambda s, a: s.workers.on_register(a), WORKER),
    "heartbeat": Handler(lambda s, a: s.workers.on_heartbeat(a), WORKER),
    "lease": Handler(lambda s, a: s.workers.on_lease(a), WORKER),
    "release": Handler(lambda s, a: s.workers.on_release(a), WORKER),
    "refuse": Handler(lambda s, a: s.workers.on_refuse(a), WORKER),
    "hung": Handler(lambda s, a: s.workers.on_hung(a), WORKER),
    "poison": Handler(lambda s, a: s.workers.on_poison(a), WORKER),
    "attach": Handler(lambda s, a: s.ranks.on_attach(a), CONSUMER),
    "ack": Handler(lambda s, a: s.ranks.on_ack(a), CONSUMER, attached=True),
    "epoch_steps": Handler(lambda s, a: s.ranks.on_epoch_steps(a), CONSUMER, attached=True),
    "position": Handler(lambda s, a: s.ranks.on_position(a), CONSUMER, attached=True),
}


def serve_control(control: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket, server: ControlServer,
                  stop: threading.Event) -> list[Coroutine]:
    """What the control socket runs on an event loop until `stop`: requests, the periodic tick, and
    the monitor (handshake outcomes counted, closed connections handed to the server)."""
    return [pump_batches(control, server.handle_all, stop), ticker(server, stop),
            count_handshakes(monitor, server.metrics.auth, stop, on_event=server.connection_event)]


async def ticker(server: ControlServer, stop: threading.Event, period_s: float = 0.5) -> None:
    """Release closed connections' units, expire silent hosts and refresh gauges until `stop`."""
    while not stop.is_set():
        server.tick()
        await asyncio.sleep(period_s)
