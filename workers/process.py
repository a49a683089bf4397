"""One worker process: lease a unit, make its batches (images or text), send each under credit.

SIGINT is ignored (the daemon coordinates shutdown); SIGTERM means drain: finish the batch
in hand, say goodbye to the consumer and exit 0. The daemon hands unfinished units back. A
process whose daemon dies stops too (workers.lifeline). A unit whose lease the consumer
refuses (it restarted, or forgot this sender) is handed back and the next one leased; so is
a unit whose batch waits for credit longer than PATIENCE_S (its consumer rank may be waiting,
in lock-step with the others, for an earlier unit of another rank that only this process
can make now); leased again, it goes on where it was.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import zmq

from pipeline.plan import Unit
from pipeline.shards import Manifest
from protos import stoker_pb2 as pb
from protos.control_client import ControlClient, DispatcherUnreachable
from protos.curve import ClientKeys
from protos.framing import encode_tensors
from protos.job import JobConfig
from protos.leases import STARVED
from protos.units import unit_from_proto
from workers.lifeline import exit_with_parent, parent_alive
from workers.metrics import WorkerMetrics
from workers.sender import DataSender, Lease, LeaseRefused, Rejected, Starved
from workers.sources import BatchSource, Outgoing, make_source

log = logging.getLogger("stoker.worker")

EXIT_FINISHED = 0
EXIT_DISPATCHER_LOST = 3
EXIT_REJECTED = 4
EXIT_BAD_JOB = 5  # this host cannot serve the job (manifest or vocabulary unusable): do not restart
PATIENCE_S = 2.0  # how long a batch waits for credit before its unit is handed back (and leased again)


@dataclass(frozen=True)
class ProcessSpec:
    host_id: str
    worker_id: str
    control_endpoint: str
    job: JobConfig
    parent_pid: int  # the daemon: this process stops when it is gone
    curve: ClientKeys | None = None  # this host's CURVE keys, when the service uses them


class _Stop:
    def __init__(self, parent_pid: int) -> None:
        self.requested = False
        self.parent_pid = parent_pid

    def __call__(self) -> bool:
        return self.requested or not parent_alive(self.parent_pid)


def run_process(spec: ProcessSpec) -> int:
    """The child's main loop; returns its exit code."""
    exit_with_parent(spec.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    job = spec.job
    try:
        source = make_source(Manifest.load(job.manifest_uri), job)
    except (OSError, ValueError) as exc:
        log.error("%s: cannot serve job %s: %s", spec.worker_id, job.job_id, exc)
        return EXIT_BAD_JOB
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = _Stop(spec.parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "requested", True))
    process = _LeaseLoop(spec, source, stop)
    try:
        return process.run()
    except DispatcherUnreachable as exc:
        if stop():
            return EXIT_FINISHED
        log.error("%s: %s", spec.worker_id, exc)
        return EXIT_DISPATCHER_LOST
    except Rejected as exc:
        log.error("%s: %s", spec.worker_id, exc)
        return EXIT_REJECTED
    finally:
        process.close()


class _LeaseLoop:
    """Lease a unit, send its batches to its rank, repeat until the dispatcher says finished."""

    def __init__(self, spec: ProcessSpec, source: BatchSource, stop: _Stop) -> None:
        self.spec, self.source, self.stop = spec, source, stop
        self.metrics = WorkerMetrics()
        self.metrics.processes.inc()
        self.ctx = zmq.Context()
        self.control = ControlClient(self.ctx, spec.control_endpoint, spec.worker_id, curve=spec.curve)
        self.senders: dict[str, DataSender] = {}  # one per rank's data socket, made when a unit first goes there
        self.carried: tuple[int, Iterator[Outgoing], Outgoing] | None = None  # handed back while starved

    def run(self) -> int:
        spec = self.spec
        while not self.stop():
            reply = self.control.request(pb.ControlRequest(
                lease=pb.LeaseRequest(host_id=spec.host_id, worker_id=spec.worker_id)), should_stop=self.stop)
            kind = reply.WhichOneof("kind")
            if kind == "finished":
                return EXIT_FINISHED
            if kind == "wait":
                _idle(self.senders.values(), reply.wait.retry_after_s)
                continue
            if kind != "unit":
                raise RuntimeError(f"unexpected reply to a lease request: {reply}")
            self._work_on(reply.unit)
        return EXIT_FINISHED

    def _sender_for(self, endpoint: str) -> DataSender:
        if endpoint not in self.senders:
            self.senders[endpoint] = DataSender(self.ctx, endpoint, self.spec.host_id, self.spec.worker_id,
                                                self.spec.job.job_id, curve=self.spec.curve)
        return self.senders[endpoint]

    def _work_on(self, leased: pb.WorkUnit) -> None:
        unit = unit_from_proto(leased)
        log.debug("%s: leased unit %d", self.spec.worker_id, unit.unit_id)
        sender = self._sender_for(leased.data_endpoint)
        sender.start_unit(Lease(unit.unit_id, leased.lease_token))
        if self.carried is not None and self.carried[0] == unit.unit_id:
            _, batches, pending = self.carried  # the unit this process handed back: on from where it was
        else:
            batches = iter(self.source.batches(unit))
            pending = next(batches, None)
        self.carried = None
        try:
            while pending is not None:
                try:
                    _send_batch(self.spec.job, self.spec, unit, pending, sender, self.metrics, self.stop,
                                give_up_after_s=PATIENCE_S)
                except Starved:
                    # Hand the unit back and lease again: the job may wait, in lock-step across its
                    # ranks, for an earlier unit that only this process can make now. If the same
                    # unit comes back, this process goes on with it where it was.
                    self._release(unit, STARVED)
                    self.carried = (unit.unit_id, batches, pending)
                    break
                if self.stop():
                    break
                pending = next(batches, None)
            if pending is None:
                self.metrics.units.inc()
        except LeaseRefused as exc:
            log.warning("%s: unit %d: %s; handing it back", self.spec.worker_id, unit.unit_id, exc)
            self._release(unit, "lease refused")

    def _release(self, unit: Unit, reason: str) -> None:
        self.control.request(pb.ControlRequest(release=pb.Release(
            host_id=self.spec.host_id, worker_ids=[self.spec.worker_id], unit_ids=[unit.unit_id], reason=reason)),
            should_stop=self.stop)

    def close(self) -> None:
        self.metrics.processes.dec()
        for sender in self.senders.values():
            sender.close()
        self.control.close()
        self.ctx.term()


def _idle(senders, seconds: float) -> None:
    """Wait for a lease; every consumer this process sends to hears that it is still alive."""
    senders = list(senders)
    if not senders:
        time.sleep(seconds)
        return
    for sender in senders:
        sender.idle(seconds / len(senders))


def _send_batch(job: pb.JobSpec, spec: ProcessSpec, unit: Unit, batch: Outgoing, sender: DataSender,
                metrics: WorkerMetrics, stop: _Stop, give_up_after_s: float | None = None) -> None:
    framing_from = time.perf_counter()
    header = batch.header
    header.job_id, header.worker_id = job.job_id, spec.worker_id
    header.epoch, header.unit_id = unit.epoch, unit.unit_id
    frames = encode_tensors(header, batch.tensors, checksum=job.checksum)
    send_s = time.perf_counter() - framing_from
    try:
        waited = sender.wait_for_credit(stop, give_up_after_s=give_up_after_s)
    except Starved as exc:
        metrics.credit_wait.inc(exc.waited)
        raise
    if sender.credit <= 0:  # stopped while waiting
        return
    header.stages.wait_for_credit = waited
    header.stages.send = send_s
    header.created_unix = time.time()
    nbytes = sender.send(header, frames)
    metrics.credit_wait.inc(waited)
    metrics.batches.inc()
    metrics.bytes_sent.inc(nbytes)
    batch.observe(metrics)


def process_main(spec: ProcessSpec) -> None:
    """multiprocessing target: exit with run_process's code."""
    raise SystemExit(run_process(spec))
