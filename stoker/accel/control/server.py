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
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import zmq
import zmq.asyncio

from stoker.accel.aio import pump_batches
from stoker.accel.control.dispatcher import Dispatcher, RankError
from stoker.accel.control.fleet_member import Need, need_from_proto, summed
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.watchdog import StallBounds, Watchdog
from stoker.pipeline.unit_wire import unit_to_proto
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import CONSUMER, NOBODY, WORKER, Caller, ServerKeys, caller_of
from stoker.protos.droplog import DropLog
from stoker.protos.endpoints import bind
from stoker.protos.framing import MAX_HEADER_BYTES, frame_bytes
from stoker.protos.leases import HOST_ID_IN_USE, REREGISTERED, UNREACHABLE, LeaseSigner
from stoker.protos.sockets import CONTROL_MESSAGE_BYTES, end_context, router, send_nowait
from stoker.protos.zap import HANDSHAKE_EVENTS, KeyAuthenticator, count_handshakes

log = logging.getLogger("stoker.dispatcher")
MAX_NAME = 256  # longest host or worker id accepted
CLOSE_GRACE_S = 1.0  # a closed connection whose peer has not come back this long: its leases are re-leased
CONNECTION_CLOSED = "connection_closed"  # the reason those units count under
REPLY_CACHE_PEERS = 4096  # peers whose last reply is kept for retries; a flood of identities cannot grow it
DAEMON_LIVE_BEATS = 3  # a daemon heard within this many heartbeat periods holds its host id against another


MAX_QUERIED_UNITS = 64  # units one poison query may ask about (a process holds one per rank)
NEED_FRESH_S = 10.0  # a rank's need older than this is not counted (the rank has gone quiet)


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
    def __init__(self, socket: zmq.Socket, dispatcher: Dispatcher, job: pb.JobSpec,
                 metrics: ControlMetrics, leases: LeaseSigner, access: AccessPolicy,
                 stall: StallBounds | None = None) -> None:
        self.socket = socket
        self.dispatcher = dispatcher
        self.job = job
        self.metrics = metrics
        self.leases = leases
        self.access = access
        self._last_reply: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
        self._drops = DropLog(log, "a control message", metrics.control_dropped)
        self.dropped = self._drops.counts  # by reason
        self.told_finished: set[str] = set()  # hosts that have heard "finished"
        self._consumers: dict[bytes, tuple[int, str]] = {}  # peer -> (rank, consumer id) of attached ranks
        self._silent_reported: set[int] = set()
        self._outbox: list[tuple[bytes, bytes]] | None = None  # answers held until the journal is synced
        self._compactions_counted = 0
        self._fd_of: dict[bytes, int] = {}  # peer -> the connection (file descriptor) it last spoke on
        self._peer_on: dict[int, bytes] = {}  # ... and back
        self._leaser: dict[bytes, tuple[str, str]] = {}  # peer -> (host, worker) it leases as
        self._closed: dict[bytes, tuple[float, int]] = {}  # peer -> when its connection closed, and which
        self._unreachable: set[tuple[str, int]] = set()  # (host, rank) pairs reported as unable to reach the rank
        self._daemon_of: OrderedDict[str, tuple[bytes, float]] = OrderedDict()  # host -> (its daemon, last heard)
        self.on_failure: Callable[[str], None] = lambda reason: None  # the job failed: the consumer here stops
        # This run of the job: a job resumed in place keeps its id but not this, so what a daemon still
        # holds from the run before (processes, leases, connections to ranks that died) is told apart.
        self.run_id = secrets.token_hex(8)
        self.watchdog = Watchdog(stall or StallBounds(), dispatcher.clock)
        self._stall_said_at: float | None = None  # when the stall line was last logged
        self._needs: dict[int, tuple[Need, float]] = {}  # rank -> what it last said it measures, and when

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

    def _handle_one(self, frames: list) -> None:
        peer = frame_bytes(frames[0])
        if len(frames) != 2 or len(frames[1]) > MAX_HEADER_BYTES:
            self._drop("bad_frames", peer)
            return
        self._spoke(peer, frames[1])
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
        caller = caller_of(frames[1]) if self.access.keyed else NOBODY
        refusal = self.access.refusal(kind, caller, request)
        if refusal is not None:
            self._drop(refusal, peer)
            self._send(peer, pb.ControlReply(request_id=request.request_id,
                                             error=pb.Error(message=_REFUSED[refusal])).SerializeToString())
            return
        asker = peer + b"\0" + caller.name.encode()  # a reply is only ever repeated to the key it was made for
        cached = self._last_reply.get(asker)
        if cached and cached[0] == request.request_id:
            self._send(peer, cached[1])
            return
        reply = self._answer(request, caller, peer)
        reply.request_id = request.request_id
        payload = reply.SerializeToString()
        self._last_reply[asker] = (request.request_id, payload)
        self._last_reply.move_to_end(asker)
        if len(self._last_reply) > REPLY_CACHE_PEERS:
            self._last_reply.popitem(last=False)
        self._send(peer, payload)

    def _answer(self, request: pb.ControlRequest, caller: Caller, peer: bytes) -> pb.ControlReply:
        """The reply of the request's handler (HANDLERS); a consumer's request before it attached is refused."""
        kind = request.WhichOneof("kind")
        handler = HANDLERS.get(kind or "")
        if handler is None:
            return pb.ControlReply(error=pb.Error(message=f"unknown request {kind}"))
        asked = Asked(request, caller, peer, self._consumers.get(peer))
        if handler.attached:
            if asked.rank is None:
                return pb.ControlReply(error=pb.Error(message="attach first"))
            self.dispatcher.liveness.rank_heard(*asked.rank)
        return handler.answer(self, asked)

    # ---- one handler per request kind (HANDLERS, below the class, says who may send each) ----
    def _on_fleet_beat(self, asked: Asked) -> pb.ControlReply:
        """A fleet's message, sent here by a daemon or a job given this address as a fleet's."""
        return pb.ControlReply(error=pb.Error(message=f"this is job {self.job.job_id}'s dispatcher, not a fleet "
                                                      "(stoker fleet): a worker of this job alone takes --dispatcher "
                                                      "here, a fleet's worker and a job take --fleet at the fleet's "
                                                      "address"))

    def _on_register(self, asked: Asked) -> pb.ControlReply:
        d, register = self.dispatcher, asked.request.register
        taken = self._host_id_taken(register.host_id, asked.peer)
        if taken:
            log.error("%s", taken)
            return pb.ControlReply(error=pb.Error(message=taken))
        d.liveness.heartbeat(register.host_id)
        if d.over:  # a daemon joins a job only while it runs (a job restarted later joins anew)
            return self._finished(register.host_id)
        log.info("host %s registered with %d processes", register.host_id, register.procs)
        # A daemon registers when it starts or after it left the job, its processes stopped: whatever
        # its worker ids still hold here (a restarted dispatcher's journal) is held by nobody.
        stale = d.release(register.host_id, None, REREGISTERED, key=asked.caller.name if self.access.keyed else None)
        if stale:
            log.warning("host %s registered again: its %d earlier leases go back to the queue", register.host_id,
                        stale)
        return pb.ControlReply(registered=pb.Registered(job=self.job, run_id=self.run_id))

    def _on_heartbeat(self, asked: Asked) -> pb.ControlReply:
        d, beat = self.dispatcher, asked.request.heartbeat
        if self._host_id_taken(beat.host_id, asked.peer):  # the second daemon's: it is not heard
            return pb.ControlReply(error=pb.Error(message=f"host id {beat.host_id} {HOST_ID_IN_USE}"))
        d.liveness.heartbeat(beat.host_id)
        if self._other_run(beat.job_id, beat.run_id):
            return self._other_job()
        self.watchdog.heard_host(beat.host_id, beat.activity)
        return self._finished(beat.host_id) if d.over else pb.ControlReply(ok=pb.Ok())

    def _on_lease(self, asked: Asked) -> pb.ControlReply:
        d, lease = self.dispatcher, asked.request.lease
        self._leaser[asked.peer] = (lease.host_id, lease.worker_id)
        if self._other_run(lease.job_id, lease.run_id):
            return self._other_job()
        if d.over:
            return self._finished(lease.host_id, daemon=False)
        unit = d.lease(lease.host_id, lease.worker_id, asked.request.request_id, asked.caller.name, lease.holding)
        if unit is None:
            return pb.ControlReply(wait=pb.Wait(retry_after_s=0.2))
        token = self.leases.token(unit.unit_id, lease.host_id, lease.worker_id, asked.caller.name)
        leased = unit_to_proto(unit, token, d.liveness.endpoint(unit.rank) or "")
        for sample_id, why in d.poison.in_unit(unit).items():
            leased.skip.add(sample_id=sample_id, reason=why)
        return pb.ControlReply(unit=leased)

    def _on_release(self, asked: Asked) -> pb.ControlReply:
        r = asked.request.release
        if self._other_run("", r.run_id):  # units of a run that is over: they mean nothing here
            return self._other_job()
        if r.reason == UNREACHABLE:
            self._report_unreachable(r.host_id, list(r.unit_ids))
        if r.HasField("crashed_sample"):
            self._sample_crashed(r)
        count = self.dispatcher.release(r.host_id, list(r.worker_ids) or None, r.reason or "released",
                                        list(r.unit_ids) or None, asked.caller.name if self.access.keyed else None)
        log.info("host %s released %d units (%s)", r.host_id, count, one_line(r.reason))
        return pb.ControlReply(ok=pb.Ok())

    def _on_hung(self, asked: Asked) -> pb.ControlReply:
        """A worker process ran a transform past --transform-timeout on a sample (it cut the call short and
        skipped it), or its daemon found it stuck there and kills it. The sample is skipped from now on."""
        hung = asked.request.hung
        if self._other_run("", hung.run_id):
            return self._other_job()
        worker = one_line((hung.worker_id or hung.host_id)[:MAX_NAME])
        how = f"{worker}, {hung.seconds:.0f} s" + (", stuck in C code: killed" if hung.stuck else "")
        log.error("worker process %s ran its transform on sample %d of unit %d for %.0f s, past --transform-timeout"
                  "%s", worker, hung.sample_id, hung.unit_id, hung.seconds,
                  " without answering its time limit (stuck in C code): its daemon kills it" if hung.stuck else "")
        poison = self.dispatcher.poison
        if poison.hung(hung.sample_id, how, hung.seconds):
            self.metrics.poison_samples.inc()
            log.error("sample %d is skipped from now on: %s", hung.sample_id, poison.why(hung.sample_id))
        return pb.ControlReply(ok=pb.Ok())

    def _on_poison(self, asked: Asked) -> pb.ControlReply:
        """A worker process that waited with units in hand: their samples that became poison meanwhile."""
        skips = pb.Skips()
        for unit_id in asked.request.poison.unit_ids[:MAX_QUERIED_UNITS]:
            unit = self.dispatcher.plan.unit(unit_id)
            for sample_id, why in (self.dispatcher.poison.in_unit(unit).items() if unit is not None else ()):
                skips.samples.add(sample_id=sample_id, reason=why)
        return pb.ControlReply(skips=skips)

    def _on_refuse(self, asked: Asked) -> pb.ControlReply:
        return self._refused(asked.request.refuse)

    def _on_attach(self, asked: Asked) -> pb.ControlReply:
        attach = asked.request.attach
        try:
            self.dispatcher.attach_rank(attach.rank, attach.data_endpoint, attach.consumer_id, attach.world_size)
        except RankError as exc:
            log.error("refused consumer %s as rank %d: %s", attach.consumer_id, attach.rank, exc)
            return pb.ControlReply(error=pb.Error(message=str(exc)))
        if attach.HasField("start"):
            error = self._start_rank(attach)
            if error:
                return pb.ControlReply(error=pb.Error(message=error))
        self._consumers[asked.peer] = (attach.rank, attach.consumer_id)
        self._silent_reported.discard(attach.rank)
        if attach.data_endpoint:
            log.info("rank %d (consumer %s) receives on %s", attach.rank, attach.consumer_id, attach.data_endpoint)
        return pb.ControlReply(attached=pb.Attached(job=self.job, lease_key=self.leases.key))

    def _on_ack(self, asked: Asked) -> pb.ControlReply:
        d, ack, rank = self.dispatcher, asked.request.ack, asked.rank
        assert rank is not None, "HANDLERS: an ack comes from an attached consumer"
        self.watchdog.rank_waiting(rank[0], ack.waiting_s)
        if ack.HasField("need"):
            self.heard_need(rank[0], need_from_proto(ack.need))
        for unit_id in ack.received:
            d.received(unit_id)
        for unit_id in ack.redo:
            self.redo_short(rank[0], unit_id)
        counts = list(ack.batches)
        for i, unit_id in enumerate(ack.unit_ids):
            d.ack(unit_id, counts[i] if i < len(counts) else None)
        reply = (pb.ControlReply(finished=pb.Finished(job_id=self.job.job_id)) if d.finished
                 else pb.ControlReply(ok=pb.Ok()))
        reply.stats.CopyFrom(pb.JobStats(**asdict(d.stats())))
        return reply

    def redo_short(self, rank: int, unit_id: int) -> bool:
        """The rank got a unit short (its sender went silent in the middle): lease it again; unless its
        holder is, by its daemon's last heartbeat, transforming a sample of it. Then the daemon ends
        that call at --transform-timeout (a report that makes the sample poison, and for a process stuck
        in C code a kill that releases the unit), so the unit is leased again only once the sample
        that held it up is known, never with that sample still in it."""
        lease = self.dispatcher.leases.get(unit_id)
        holder = self.watchdog.holder(lease) if lease is not None else None
        if holder is not None and holder.phase == "transforming" and holder.working_on == unit_id:
            log.warning("rank %d: unit %d's sender went silent while %s; not leasing it again until its daemon "
                        "ends that call (at --transform-timeout)", rank, unit_id, holder.describe())
            return False
        if self.dispatcher.redo(unit_id):
            log.warning("rank %d: unit %d ended short of its samples; leasing it again", rank, unit_id)
            return True
        return False

    def heard_need(self, rank: int, need: Need) -> None:
        """What `rank` measures now (its acks carry it; rank 0 in this process says it directly)."""
        self._needs[rank] = (need, self.dispatcher.clock())

    def job_need(self) -> Need:
        """The job's need for a fleet: its ranks' (heard within NEED_FRESH_S), summed."""
        now = self.dispatcher.clock()
        return summed([need for need, at in self._needs.values() if now - at <= NEED_FRESH_S])

    def _on_epoch_steps(self, asked: Asked) -> pb.ControlReply:
        e = asked.request.epoch_steps
        steps = self.dispatcher.progress.epoch_steps(e.epoch, e.rank, e.batches)
        return pb.ControlReply(wait=pb.Wait(retry_after_s=0.05)) if steps is None else \
            pb.ControlReply(steps=pb.Steps(steps=steps))

    def _on_position(self, asked: Asked) -> pb.ControlReply:
        ranks = self.dispatcher.progress.position(asked.request.position.epoch, asked.request.position.step)
        return pb.ControlReply(position=pb.Position(ranks=[pb.RankPosition(units=u, batches=b) for u, b in ranks]))

    def _start_rank(self, attach: pb.Attach) -> str:
        """A rank's consumer says where it starts: what this dispatcher counts done past that goes back to the
        queue (accel.control.dispatcher.Dispatcher.rewind_rank); the refusal's line, or ""."""
        start = attach.start
        try:
            count = self.dispatcher.rewind_rank(attach.rank, attach.consumer_id, start.epoch, start.step, start.units,
                                                start.batches)
        except RankError as exc:
            log.error("refused consumer %s as rank %d: %s", one_line(attach.consumer_id[:MAX_NAME]), attach.rank, exc)
            return str(exc)
        if count:
            log.warning("rank %d starts at step %d of epoch %d (its checkpoint): %d of its units done since then go "
                        "back to the queue (a consumer that stepped them crashed after its last checkpoint)",
                        attach.rank, start.step, start.epoch, count)
        return ""

    def _report_unreachable(self, host_id: str, unit_ids: list[int]) -> None:
        """A host cannot reach a rank's data socket: say so here too (once per host and rank), where
        whoever runs the job looks, with the address."""
        for unit_id in unit_ids[:16]:
            unit = self.dispatcher.plan.unit(unit_id)
            if unit is None or (host_id, unit.rank) in self._unreachable:
                continue
            if len(self._unreachable) < REPLY_CACHE_PEERS:
                self._unreachable.add((host_id, unit.rank))
            log.error("host %s cannot reach rank %d's data socket at %s (its worker heard nothing from it for "
                      "10 s): that rank must listen on an address the worker hosts reach ($STOKER_HOST, "
                      "--data-bind / --advertise-host)", host_id[:MAX_NAME], unit.rank,
                      self.dispatcher.liveness.endpoint(unit.rank))

    def _sample_crashed(self, release: pb.Release) -> None:
        """A worker process died transforming a sample: the second time, the sample is skipped from then on."""
        sample_id = release.crashed_sample
        worker = one_line((release.worker_ids[0] if release.worker_ids else release.host_id)[:MAX_NAME])
        how = f"{worker}, {one_line(release.reason[:100])}"
        log.error("worker process %s died transforming sample %d", how, sample_id)
        if self.dispatcher.poison.crashed(sample_id, how):
            self.metrics.poison_samples.inc()
            log.error("sample %d is skipped from now on: %s", sample_id, self.dispatcher.poison.why(sample_id))

    def _refused(self, refusal: pb.Refusal) -> pb.ControlReply:
        """A worker cannot run the job as pinned: the job fails, with its line, everywhere it is watched."""
        if refusal.job_id and refusal.job_id != self.job.job_id:
            return self._other_job()
        self.metrics.refusals.inc()
        self._fail(f"host {refusal.host_id[:MAX_NAME]} refused the job: {one_line(refusal.reason[:1000])}")
        return pb.ControlReply(ok=pb.Ok())

    def _fail(self, line: str) -> None:
        """The job fails with `line`, everywhere it is watched: the log, the metric, every rank."""
        if self.dispatcher.fail(line):
            log.error("the job fails: %s", line)
            self.metrics.failure.labels(reason=line).set(1)
            self.on_failure(line)

    def _host_id_taken(self, host_id: str, peer: bytes) -> str:
        """Why `peer` may not speak as the daemon of `host_id` ("": it may, and is now heard as it): another
        daemon spoke under that host id within DAEMON_LIVE_BEATS heartbeats. Two daemons under one id would
        take each other's leases back; a daemon that restarted is let in once its predecessor is silent."""
        now = self.dispatcher.clock()
        known = self._daemon_of.get(host_id)
        window = DAEMON_LIVE_BEATS * (self.job.heartbeat_s if self.job.HasField("heartbeat_s") else 1.0)
        if known is not None and known[0] != peer and now - known[1] < window:
            return (f"host id {host_id} {HOST_ID_IN_USE} (its daemon was heard {now - known[1]:.1f} s ago): "
                    f"give each worker daemon its own --host-id")
        self._daemon_of[host_id] = (peer, now)
        self._daemon_of.move_to_end(host_id)
        if len(self._daemon_of) > REPLY_CACHE_PEERS:
            self._daemon_of.popitem(last=False)
        return ""

    def _other_run(self, job_id: str, run_id: str) -> bool:
        """The asker works for another job, or an earlier run of this one ("": not said, not checked)."""
        return bool(job_id and job_id != self.job.job_id) or bool(run_id and run_id != self.run_id)

    def _other_job(self) -> pb.ControlReply:
        return pb.ControlReply(other_job=pb.OtherJob(job_id=self.job.job_id, run_id=self.run_id))

    def _finished(self, host_id: str, daemon: bool = True) -> pb.ControlReply:
        """"finished"; the host counts as told when its daemon (register, heartbeat) heard it: the daemon is
        what leaves (--once) and stops its processes, and a process asking for a lease is not the daemon."""
        if daemon:
            self.told_finished.add(host_id)
        return pb.ControlReply(finished=pb.Finished(job_id=self.job.job_id))

    def hosts_not_told(self) -> set[str]:
        """Live hosts whose daemon has not yet heard that the job is finished."""
        return set(self.dispatcher.liveness.live_hosts()) - self.told_finished

    # ---- connections ---------------------------------------------------------------------
    def _spoke(self, peer: bytes, frame: object) -> None:
        """Which connection the peer spoke on (ZMQ_SRCFD of its message), so that its closing names it. A
        message read after its connection closed (it was queued) changes nothing; one on a new
        connection means the peer is back."""
        fd = frame.get(zmq.SRCFD) if isinstance(frame, zmq.Frame) else None
        closed = self._closed.get(peer)
        if closed is not None and (fd is None or fd == closed[1]):
            return
        self._closed.pop(peer, None)
        if fd is None or self._fd_of.get(peer) == fd:
            return
        self._peer_on.pop(self._fd_of.get(peer, -1), None)
        self._fd_of[peer] = fd
        self._peer_on[fd] = peer

    def connection_event(self, event: Mapping[str, Any]) -> None:
        """From the socket's monitor: a connection closed (its peer is dead, or reconnecting)."""
        if event["event"] != zmq.EVENT_DISCONNECTED:
            return
        peer = self._peer_on.pop(event["value"], None)
        if peer is not None and self._fd_of.get(peer) == event["value"]:
            del self._fd_of[peer]
            self._closed[peer] = (self.dispatcher.clock(), event["value"])

    def _release_closed(self) -> None:
        """Re-lease the units of worker processes whose connection closed and stayed closed."""
        now = self.dispatcher.clock()
        for peer, (closed_at, _) in list(self._closed.items()):
            if now - closed_at < CLOSE_GRACE_S:
                continue
            del self._closed[peer]
            leaser = self._leaser.pop(peer, None)
            if leaser is not None:
                count = self.dispatcher.release(leaser[0], [leaser[1]], CONNECTION_CLOSED)
                if count:
                    log.warning("worker %s of host %s closed its connection: its %d unit(s) are re-leased",
                                leaser[1], leaser[0], count)

    def tick(self) -> None:
        """Periodic: re-lease the units of closed connections, expire silent hosts, report ranks
        that went silent (their streams stall)."""
        self._release_closed()
        for host in self.dispatcher.expire_hosts():
            log.warning("host %s missed its heartbeats; its units are re-leased", host)
        silent = set(self.dispatcher.liveness.silent_ranks())
        for rank in sorted(silent - self._silent_reported):
            log.error("rank %d has not been heard from for %.0f s: its batches wait, and the job cannot finish "
                      "without it (restart every rank from the last state_dict)", rank, self.dispatcher.host_timeout_s)
        self._silent_reported = silent
        self.metrics.ranks_silent.set(len(silent))
        self._watch_stalls()
        if self.dispatcher.journal is not None:
            self.dispatcher.journal.sync()  # the releases of expired hosts
        self.update_gauges()

    def _watch_stalls(self) -> None:
        """Say who holds what a waiting rank needs (pace: once per report bound), and fail the job once
        it has waited the second bound for units that are pending or leased (accel.control.watchdog)."""
        d, bounds = self.dispatcher, self.watchdog.bounds
        for rank, seconds in self.watchdog.waited().items():
            self.metrics.rank_waiting.labels(rank=str(rank)).set(seconds)
        for rank in set(range(d.plan.world_size)) - set(self.watchdog.waited()):
            self.metrics.rank_waiting.labels(rank=str(rank)).set(0)
        stall = None if d.over else self.watchdog.check(d)
        self.metrics.stall_holders.clear()
        if stall is None:
            d.stall, self._stall_said_at = "", None
            return
        line = one_line(stall.line)
        d.stall = line
        for h in stall.holders:
            self.metrics.stall_holders.labels(rank=str(h.rank), unit=str(h.unit_id), host=one_line(h.host_id),
                                              process=one_line(h.worker_id), phase=h.phase,
                                              sample=str(h.sample_id) if h.sample_id >= 0 else "").set(h.for_s)
        now = d.clock()
        if bounds.fail_s and stall.waited_s >= bounds.fail_s and stall.has_work:
            self._fail(f"no batch for {stall.waited_s:.0f} s (--stall-timeout {bounds.fail_s:g}): {line}")
        elif self._stall_said_at is None or now - self._stall_said_at >= bounds.report_s:
            self._stall_said_at = now
            log.error("stalled: %s%s", line, f" (the job fails at {bounds.fail_s:g} s: --stall-timeout)"
                      if bounds.fail_s and stall.has_work else "")

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




@dataclass(frozen=True)
class Asked:
    """One request as a handler sees it: the message, who sent it (key and connection), and the rank its
    connection attached as (None: no consumer attached on it)."""

    request: pb.ControlRequest
    caller: Caller
    peer: bytes
    rank: tuple[int, str] | None


@dataclass(frozen=True)
class Handler:
    """How the server answers one kind of request, and who may send it: WORKER (a worker daemon or
    process) or CONSUMER (a rank; `attached`: only on a connection that attached as one)."""

    answer: Callable[[ControlServer, Asked], pb.ControlReply]
    role: str
    attached: bool = False


# every kind of ControlRequest (stoker/protos/stoker.proto's oneof; a test checks the two agree)
HANDLERS: dict[str, Handler] = {
    "register": Handler(ControlServer._on_register, WORKER),
    "heartbeat": Handler(ControlServer._on_heartbeat, WORKER),
    "lease": Handler(ControlServer._on_lease, WORKER),
    "release": Handler(ControlServer._on_release, WORKER),
    "refuse": Handler(ControlServer._on_refuse, WORKER),
    "hung": Handler(ControlServer._on_hung, WORKER),
    "poison": Handler(ControlServer._on_poison, WORKER),
    "fleet_host": Handler(ControlServer._on_fleet_beat, WORKER),  # misdirected: answered with what this is
    "fleet_job": Handler(ControlServer._on_fleet_beat, WORKER),
    "attach": Handler(ControlServer._on_attach, CONSUMER),
    "ack": Handler(ControlServer._on_ack, CONSUMER, attached=True),
    "epoch_steps": Handler(ControlServer._on_epoch_steps, CONSUMER, attached=True),
    "position": Handler(ControlServer._on_position, CONSUMER, attached=True),
}

def one_line(text: str) -> str:
    """`text` on one line: a peer's free text cannot start a log line of its own."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else "?" for c in text)


def _too_long(body: object) -> bool:
    """Names longer than MAX_NAME would let one peer grow the dispatcher's tables without bound, and a
    name with a newline or another control character could forge the dispatcher's log lines."""
    names = [getattr(body, f, "") for f in ("host_id", "worker_id", "consumer_id")]
    names += list(getattr(body, "worker_ids", []))
    reason = getattr(body, "reason", "")
    return (any(len(n) > MAX_NAME or not n.isprintable() for n in names if isinstance(n, str))
            or (isinstance(reason, str) and len(reason) > MAX_NAME))


def control_router(ctx: zmq.asyncio.Context, keys: ServerKeys | None) -> tuple[zmq.asyncio.Socket,
                                                                                 zmq.asyncio.Socket]:
    """The dispatcher's ROUTER (unroutable replies raise, small messages only, CURVE when keyed),
    and its monitor (closed connections, and handshakes when keyed), made before it binds."""
    sock = router(ctx, CONTROL_MESSAGE_BYTES, keys)
    # A client that times out opens a new socket under the same identity while its old one is torn
    # down: without handover the ROUTER keeps the old pipe and leaves the new one unrouted, and each
    # retry (another new socket) can meet the same race, so a client under load may never be answered.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock, sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | (HANDSHAKE_EVENTS if keys else 0))


def bind_control(ctx: zmq.asyncio.Context, keys: ServerKeys | None,
                 endpoint: str) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket, str]:
    """The control ROUTER and its monitor, bound to `endpoint`; returns both and the endpoint bound.
    A bind that fails (a port in use) closes both before it raises: an open monitor socket would
    hold the context's term() for ever, so the caller would hang instead of reporting the port."""
    sock, monitor = control_router(ctx, keys)
    try:
        bound = bind(sock, endpoint, "control")
    except BaseException:
        monitor.close(0)
        sock.close(0)
        raise
    return sock, monitor, bound


def guarded_control(ctx: zmq.asyncio.Context, keys: ServerKeys | None,
                    endpoint: str) -> tuple[KeyAuthenticator | None, zmq.asyncio.Socket, zmq.asyncio.Socket, str]:
    """ZAP (with keys) started before the control ROUTER binds, then the bind (bind_control): a bind that
    fails stops ZAP and ends the context before it raises, so nothing is left to wait on."""
    authenticator = KeyAuthenticator(ctx, keys) if keys else None
    if authenticator is not None:
        authenticator.start()  # before the bind
    try:
        sock, monitor, bound = bind_control(ctx, keys, endpoint)
    except BaseException:
        if authenticator is not None:
            authenticator.stop()
        end_context(ctx)
        raise
    return authenticator, sock, monitor, bound


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
