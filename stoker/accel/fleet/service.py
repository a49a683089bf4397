"""`stoker fleet`: one pool of worker hosts for many jobs.

Worker daemons (`stoker worker --fleet ENDPOINT`) and jobs (`stoker run|train|dispatch --fleet
ENDPOINT`) beat here once a second; the fleet answers each host with what it should run (so many
processes for each job, and where that job's dispatcher is) and each job with what it holds and
why. What it decides is in fleet.py (the book) and allocation.py (the shares); this module is the
socket, the metrics and the log. With keys a host must beat with a worker key and a job with a job
key (`stoker keys add DIR NAME --role job`); anything else is dropped, counted and answered with one
line. Its requests and answers have their own envelope (FleetRequest, FleetReply): a dispatcher's request
sent here has none of its kinds, and is dropped and counted as any malformed one is. The fleet moves
capacity, never units: it sees no job's units, and a job's processes lease from that job's own dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge

from stoker.accel.control.fleet_seat import asked_of
from stoker.accel.control.metrics import serve_registry
from stoker.accel.control.serving.control_socket import run_service, serving
from stoker.accel.control.serving.routing import Asked, Handler, one_line, read_request
from stoker.accel.fleet.book import Decision, FleetBook, Job
from stoker.accel.fleet.config import FleetConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.aio import pump_batches, run_until_one_fails
from stoker.protos.control_client import MISDIRECTED
from stoker.protos.curve import JOB, NOBODY, WORKER, Caller, ServerKeys, caller_of
from stoker.protos.droplog import DropLog
from stoker.protos.endpoints import advertised, peer_endpoint_problem, serves
from stoker.protos.errors import ConfigError, PeerError
from stoker.protos.exposure import check_exposure
from stoker.protos.framing import frame_bytes
from stoker.protos.sd_notify import Notifier
from stoker.protos.sockets import send_nowait
from stoker.protos.zap import count_handshakes

log = logging.getLogger("stoker.fleet")

MAX_ID = 256  # host and job ids, endpoints: longer is not a Stoker peer


class FleetMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.hosts = Gauge("stoker_fleet_hosts", "Worker hosts beating to the fleet (draining ones included)",
                           registry=r)
        self.processes = Gauge("stoker_fleet_processes", "Worker processes the fleet's live hosts offer (draining "
                               "hosts not counted)", registry=r)
        self.cores = Gauge("stoker_fleet_cores", "CPU cores those processes may use (one each where a host runs a "
                           "process per core it gives Stoker)", registry=r)
        self.cores_needed = Gauge("stoker_fleet_cores_needed", "CPU cores every job wants, summed: what the fleet "
                                  "would need to feed them all (an autoscaler's target)", registry=r)
        self.cores_missing = Gauge("stoker_fleet_cores_missing", "CPU cores the jobs want beyond what the fleet "
                                   "gives them: what an autoscaler should add", registry=r)
        self.idle = Gauge("stoker_fleet_processes_idle", "Worker processes no job holds", registry=r)
        job = ["job"]
        self.job_processes = Gauge("stoker_fleet_job_processes", "Worker processes hosts were told to run for the job",
                                   job, registry=r)
        self.job_target = Gauge("stoker_fleet_job_target", "Worker processes the fleet converges to for the job",
                                job, registry=r)
        self.job_wanted = Gauge("stoker_fleet_job_cores_needed", "CPU cores the job wants: its measured need (plus "
                                "headroom), its planner estimate until measured, or without one what it "
                                "holds (a small start and idle processes)",
                                job, registry=r)
        self.job_missing = Gauge("stoker_fleet_job_cores_missing", "CPU cores the job wants beyond its target", job,
                                 registry=r)
        self.job_stall = Gauge("stoker_fleet_job_stall_fraction", "The job's device's wait for input over its last "
                               "window, as the job reported it", job, registry=r)
        self.job_share = Gauge("stoker_fleet_job_share", "The job's processes over the fleet's", job, registry=r)
        self.job_weight = Gauge("stoker_fleet_job_weight", "The job's weight", job, registry=r)
        self.moves = Counter("stoker_fleet_moves", "Worker processes moved from one job (or idle) to another",
                             registry=r)
        self.dropped = Counter("stoker_fleet_dropped", "Messages dropped by reason (bad frames, wrong role, bad "
                               "values)", ["reason"], registry=r)
        self.auth = Counter("stoker_fleet_auth", "CURVE connections: admitted, refused or failed_handshake",
                            ["result"], registry=r)
        self._jobs: set[str] = set()
        self._moves_counted = 0

    def update(self, book: FleetBook) -> None:
        self.hosts.set(len(book.hosts))
        capacity = book.capacity()
        per_process = book.cores_per_process()
        held = book.holding()  # once: it reads every host
        self.processes.set(capacity)
        self.cores.set(capacity * per_process)
        self.idle.set(max(0, capacity - sum(held.values())))
        self.moves.inc(book.moves_total - self._moves_counted)
        self._moves_counted = book.moves_total
        wanted = missing = 0.0
        for job_id, job in book.jobs.items():
            share = book.share_of(job_id, held)
            want = job.want_cores if job.want_cores is not None else share.target * per_process
            wanted += want
            missing += share.missing * per_process
            self.job_processes.labels(job_id).set(share.holding)
            self.job_target.labels(job_id).set(share.target)
            self.job_wanted.labels(job_id).set(want)
            self.job_missing.labels(job_id).set(share.missing * per_process)
            self.job_stall.labels(job_id).set(job.stall_fraction)
            self.job_share.labels(job_id).set(share.holding / capacity if capacity else 0.0)
            self.job_weight.labels(job_id).set(job.weight)
        for gone in self._jobs - set(book.jobs):
            for gauge in (self.job_processes, self.job_target, self.job_wanted, self.job_missing, self.job_stall,
                          self.job_share, self.job_weight):
                gauge.remove(gone)
        self._jobs = set(book.jobs)
        self.cores_needed.set(wanted)
        self.cores_missing.set(missing)


class FleetServer:
    """Answers beats from a ROUTER: one handler per kind, each with the role it requires."""

    def __init__(self, socket: zmq.Socket, book: FleetBook, metrics: FleetMetrics, keyed: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.book = book
        self.metrics = metrics
        self.keyed = keyed
        self.clock = clock
        self._drops = DropLog(log, "a fleet message", metrics.dropped)
        self.dropped = self._drops.counts
        self._owners: dict[str, str] = {}  # job id -> the key name that registered it (keys only)

    def handle_all(self, batch: list[list]) -> None:
        for frames in batch:
            try:
                self._handle_one(frames)
            except Exception:  # one message, whatever it holds, never takes the fleet down for every job
                log.exception("a fleet message could not be handled; dropped")
                self._drops("bad_value", frame_bytes(frames[0]) if frames else b"")

    def tick(self) -> None:
        """Four times a second: lost hosts and jobs, a round when one is due, and the metrics (not after every
        message: at 1,000 hosts a beat arrives every millisecond, and the metrics read every host)."""
        self._log(self.book.expire(self.clock()) + self.book.rebalance(self.clock()))
        self.metrics.update(self.book)

    def _not_a_dispatcher(self, peer: bytes, request_id: int) -> None:
        """A dispatcher's request, sent here by a worker or a rank given this address as a dispatcher's."""
        error = pb.Error(reason=MISDIRECTED, message="this is a fleet (stoker fleet), not a dispatcher: point workers "
                                                     "at it with --fleet, and a job's ranks at its dispatcher")
        send_nowait(self.socket, [peer, pb.FleetReply(request_id=request_id, error=error).SerializeToString()])

    def _handle_one(self, frames: list) -> None:
        read = read_request(frames, pb.FleetRequest, self._drops, misdirected=self._not_a_dispatcher)
        if read is None:
            return
        peer, request, kind = read
        handler = FLEET_HANDLERS[kind]
        caller = caller_of(frames[1]) if self.keyed else NOBODY
        try:
            self._need(caller, handler.role, handler.needs)
            reply = handler.answer(self, Asked(request, caller, peer, None))
        except _Refused as exc:
            self._drops(exc.reason, peer, str(exc))
            reply = pb.FleetReply(error=pb.Error(message=str(exc)))
        except (ConfigError, ValueError) as exc:  # a figure out of range for the wire too
            self._drops("bad_value", peer, str(exc))
            reply = pb.FleetReply(error=pb.Error(message=str(exc)))
        reply.request_id = request.request_id
        self._send(peer, reply)

    def _on_host(self, asked: Asked[pb.FleetRequest]) -> pb.FleetReply:
        return pb.FleetReply(fleet_plan=self._host(asked.request.fleet_host))

    def _on_job(self, asked: Asked[pb.FleetRequest]) -> pb.FleetReply:
        self._own(asked.request.fleet_job.job_id, asked.caller if self.keyed else NOBODY)
        return pb.FleetReply(fleet_share=self._job(asked.request.fleet_job))

    def _own(self, job_id: str, caller: Caller) -> None:
        """With keys a job id belongs to the key that registered it: no other job key may beat, leave or
        re-point it (a job cannot free or take another job's processes)."""
        owner = self._owners.get(job_id)
        if job_id not in self.book.jobs:
            self._owners[job_id] = caller.name
        elif owner is not None and owner != caller.name:
            raise _Refused("not_owner", f"refused: job {job_id} is registered by another job key")

    def _need(self, caller: Caller, role: str, what: str) -> None:
        if self.keyed and caller.role != role:
            raise _Refused(f"not_{role}", f"refused: this key is not allow-listed as a {role} (needs {what})")

    def _host(self, beat: pb.FleetHost) -> pb.FleetPlan:
        _check_name("host id", beat.host_id)
        for served in beat.serving:
            _check_name("job id", served.job_id)
        running = {s.job_id: s.procs for s in beat.serving}
        self._log(self.book.host_beat(beat.host_id, beat.procs, running, beat.leaving, self.clock(), beat.cores,
                                      pid=beat.pid))
        plan = pb.FleetPlan()
        for job_id, (endpoint, procs) in sorted(self.book.plan_for(beat.host_id).items()):
            plan.jobs.add(job_id=job_id, endpoint=endpoint, procs=procs)
        return plan

    def _job(self, beat: pb.FleetJob) -> pb.FleetShare:
        _check_name("job id", beat.job_id)
        why = peer_endpoint_problem(beat.endpoint)
        if why:
            raise ConfigError(f"job {beat.job_id}: its dispatcher's endpoint {why}")
        now = self.clock()
        if beat.leaving:
            self._log(self.book.job_leaves(beat.job_id, now))
            self._owners.pop(beat.job_id, None)
            return pb.FleetShare(fleet_procs=self.book.capacity(), hosts=len(self.book.hosts), reason="left")
        job = Job(beat.job_id, *asked_of(beat), beat.want_cores if beat.HasField("want_cores") else None, beat.endpoint,
                  one_line(beat.want_reason[:300]), beat.stall_fraction, beat.cores_needed, beat.cores_in_use,
                  one_line(beat.transform[:300]), beat.stage)
        self._log(self.book.job_beat(job, now))
        share = self.book.share_of(beat.job_id)
        return pb.FleetShare(target=share.target, holding=share.holding, missing=share.missing,
                             fleet_procs=share.fleet_procs, hosts=share.hosts, reason=share.reason)

    def _send(self, peer: bytes, reply: pb.FleetReply) -> None:
        if send_nowait(self.socket, [peer, reply.SerializeToString()]) is not None:  # the asker is gone: it asks again
            self._drops("unroutable", peer)

    @staticmethod
    def _log(decisions: list[Decision]) -> None:
        for decision in decisions:
            log.info("%s", decision.text)


# every kind of FleetRequest (stoker/protos/stoker.proto's oneof), and who may send each
FLEET_HANDLERS: dict[str, Handler[FleetServer, pb.FleetReply]] = {
    "fleet_host": Handler(FleetServer._on_host, WORKER, needs="a worker key"),
    "fleet_job": Handler(FleetServer._on_job, JOB, needs="a job key (stoker keys add DIR NAME --role job)"),
}


class _Refused(PeerError):
    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


NAME = re.compile(rf"[A-Za-z0-9._:@+/-]{{1,{MAX_ID}}}")  # host and job ids: what a log line shows as it is


def _check_name(what: str, value: str) -> None:
    if not NAME.fullmatch(value):
        raise ConfigError(f"a {what} of 1 to {MAX_ID} letters, digits and . _ : @ + / -, not {value[:40]!r}")



class FleetService:
    def __init__(self, cfg: FleetConfig) -> None:
        check_exposure({"bind": cfg.bind, "metrics_addr": cfg.metrics_addr}, bool(cfg.keys), cfg.insecure,
                       risk="register as a host or a job, or read the fleet's metrics")
        self.cfg = cfg
        self.book = FleetBook(cfg.host_timeout_s, cfg.job_timeout_s, cfg.round_s, cfg.max_moves)
        self.keys = ServerKeys.load(cfg.keys) if cfg.keys else None
        self.metrics = FleetMetrics()
        self.endpoint = ""  # once bound
        self.metrics_port: int | None = None
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.systemd = Notifier()  # Type=notify: ready once bound, the watchdog fed by the ticker

    def run(self, on_ready: Callable[[FleetService], None] | None = None) -> None:
        if serves(self.cfg.metrics_port):
            self.metrics_port = serve_registry(self.metrics.registry, self.cfg.metrics_port, self.cfg.metrics_addr)
        run_service(lambda: self._serve(on_ready))

    async def _serve(self, on_ready: Callable[[FleetService], None] | None) -> None:
        async with serving(self.keys, self.cfg.bind, self.stop) as (sock, monitor, bound):
            try:
                self.endpoint = advertised(bound, None)
                server = FleetServer(sock, self.book, self.metrics, self.keys is not None)
                self.metrics.update(self.book)
                log.info("fleet on %s", self.endpoint)
                self.systemd.ready(f"serving {self.endpoint}")
                self.ready.set()
                if on_ready is not None:
                    on_ready(self)
                await run_until_one_fails([pump_batches(sock, server.handle_all, self.stop), self._ticker(server),
                                           count_handshakes(monitor, self.metrics.auth, self.stop)], self.stop)
            finally:
                self.systemd.stopping()

    async def _ticker(self, server: FleetServer) -> None:
        while not self.stop.is_set():
            server.tick()
            self.systemd.watchdog()  # the loop is alive: it answers beats
            await asyncio.sleep(0.25)
