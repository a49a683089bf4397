"""One worker process: lease units, make their batches (images or text), send each under credit.

A process holds at most one unit per data-parallel rank at a time and makes the batches of
the units it holds in step order (epoch, position, batch, rank), each only when its rank has
granted credit, so a built batch never waits. It never blocks on one rank: when none of its
units can be sent (every rank it feeds is out of credit) it leases a unit of another rank.
This is what keeps a lock-step job (every rank waits for every other at each step, as DDP's
all-reduce does) going with fewer processes than ranks: a rank that has stepped batch k and
waits for the others returns no credit until they have batch k, and the process that would
wait for that credit makes the others' batches instead. The dispatcher hands out units position
by position across the ranks and trades a held unit for an earlier pending one of its rank
(accel.control.dispatcher), so the batch the slowest rank needs next is always being made.

SIGINT is ignored (the daemon coordinates shutdown); SIGTERM means drain: finish the batch
in hand, say goodbye to the consumers and exit. The daemon hands unfinished units back. A
process whose daemon dies is killed (workers.lifeline: SIGKILL, which reaches it even inside C
code). A unit whose lease the consumer
refuses (it restarted, or forgot this sender) is handed back, and so is one whose rank's
data socket says nothing for UNREACHABLE_S (a live consumer pings a waiting sender every
few seconds): the rank is gone or cannot be reached, and the warning names its address.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import zmq

from stoker.pipeline import activity
from stoker.pipeline.activity import ActivitySlot, Phase
from stoker.pipeline.cpu_clock import CpuAccount, stage_clock
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shard_cache import CacheConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.sources import SourceRefused
from stoker.pipeline.text.tokenizer import TokenizerError
from stoker.pipeline.transforms import TransformOutputError, TransformRefused
from stoker.pipeline.unit_wire import unit_from_proto
from stoker.pipeline.units import Unit
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient, DispatcherUnreachable
from stoker.protos.curve import ClientKeys
from stoker.protos.errors import PeerError
from stoker.protos.framing import encode_tensors
from stoker.protos.leases import UNREACHABLE
from stoker.workers.lifeline import exit_with_parent, parent_alive
from stoker.workers.limits import is_out_of_tasks
from stoker.workers.metrics import WorkerMetrics
from stoker.workers.sender import DataSender, Lease, LeaseRefused, Rejected, SendTimedOut
from stoker.workers.skips import Skips
from stoker.workers.sources import BatchSource, Outgoing, make_source, unsent_part

log = logging.getLogger("stoker.worker")

# A process exits with EXIT_FINISHED only when the job is finished or it was told to stop: 0 is
# what a transform or a library that calls exit() gives, and the daemon treats that as a crash.
EXIT_FINISHED = 10
EXIT_DISPATCHER_LOST = 3
EXIT_REJECTED = 4
EXIT_BAD_JOB = 5  # this host cannot serve the job (manifest or vocabulary unusable): do not restart
EXIT_OTHER_JOB = 6  # the dispatcher serves another job now: the daemon registers again
EXIT_NO_TASKS = 7  # it could not start a thread (the host's pids or thread limit): the daemon retries later
UNREACHABLE_S = 10.0  # a rank's data socket silent this long while we wait on it: hand its unit back
HELLO_GRACE_S = 0.5  # a new unit's rank gets this long to grant credit before the process leases around it
LEASE_AGAIN_S = 0.5  # while holding units that cannot be sent, ask for another at most this often
FORGET_SENDER_S = 60.0  # a data connection with no unit on it whose rank has been silent this long is closed
REASON_CHARS = 250  # a refusal's line, within what the dispatcher accepts (accel.control.serving.server.MAX_NAME)
REFUSE_GIVE_UP_S = 10.0  # a dispatcher that does not answer a refusal this long: the process stops anyway
MAX_POISON_HELD = 65536  # samples a process skips beside its leases' lists (accel.control.poison's bound)
ASK_POISON_EVERY_S = 1.0  # a unit in hand this long (or since the last ask): ask which of its samples became poison
PROBE_THREADS = 5  # threads a process starts beside its own: zmq's I/O and reaper twice, pyzmq's garbage collector
REPORT_GIVE_UP_S = 5.0  # a dispatcher that does not hear a hung sample this long: the process goes on without


@dataclass(frozen=True)
class ProcessSpec:
    host_id: str
    worker_id: str
    control_endpoint: str
    job: JobConfig
    parent_pid: int  # the daemon: this process stops when it is gone
    curve: ClientKeys | None = None  # this host's CURVE keys, when the service uses them
    cache: CacheConfig | None = None  # this host's shard cache (None: the environment's)
    run_id: str = ""  # the run of the job its daemon registered with: a dispatcher in another answers OtherJob
    activity_slot: ActivitySlot | None = None  # where it notes what it does, for its daemon (pipeline.activity)
    host_procs: int = 1  # the worker processes its daemon runs (reported with each batch, for the diagnosis)


class _Stop:
    def __init__(self, parent_pid: int) -> None:
        self.requested = False
        self.parent_pid = parent_pid

    def __call__(self) -> bool:
        return self.requested or not parent_alive(self.parent_pid)


def run_process(spec: ProcessSpec) -> int:
    """The child's main loop; returns its exit code."""
    exit_with_parent(spec.parent_pid, signal.SIGKILL)  # stuck in a transform's C code, it would outlive its daemon
    activity.install(spec.activity_slot)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return _serve(spec)
    except Exception as exc:
        if not is_out_of_tasks(exc):
            raise
        # the daemon says it once for the host, with the limit that was met (workers.limits)
        log.debug("%s: could not start a thread (%s); its daemon tries again later", spec.worker_id, exc)
        return EXIT_NO_TASKS


def _serve(spec: ProcessSpec) -> int:
    """Make the job's source and run the lease loop; a thread the host cannot start raises out of here.
    zmq's I/O thread starts with its context, so the loop's context is made (and its threads started)
    before anything is leased: a host out of threads costs no unit."""
    _start_threads()
    job = spec.job
    try:
        source = make_source(Manifest.load(job.manifest_uri), job, spec.cache)
    except (TransformRefused, TokenizerError, SourceRefused) as exc:  # pinned to what this host does not have:
        return _refuse(spec, None, str(exc))  # the job fails with this reason, not a bare 'cannot serve'
    except (OSError, ValueError) as exc:
        log.error("%s: cannot serve job %s: %s", spec.worker_id, job.job_id, exc)
        return EXIT_BAD_JOB
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = _Stop(spec.parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "requested", True))
    process = _LeaseLoop(spec, source, stop)
    try:
        return process.run()
    except TransformOutputError as exc:  # the transform's bug, found at its first sample: the job cannot go on
        return _refuse(spec, process.control, str(exc))
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


@dataclass
class _Work:
    """A unit this process holds the lease of, and how far its batches have gone."""

    unit: Unit
    sender: DataSender
    batches: Iterator[Outgoing]
    started: float = field(default_factory=time.monotonic)
    sent: int = 0  # batches sent so far

    def order(self) -> tuple[int, int, int, int]:
        """Step order: a lock-step job needs batch k of every rank before batch k + 1 of any."""
        return self.unit.epoch, self.unit.position, self.sent, self.unit.rank

    def blocked(self, now: float) -> bool:
        """Out of credit, and its rank has had its chance to grant some."""
        return self.sender.credit <= 0 and (self.sender.welcomed or now - self.started > HELLO_GRACE_S)


class _LeaseLoop:
    """Hold units (one per rank at most), send their batches in step order, lease more when none
    can be sent, until the dispatcher says the job is finished."""

    def __init__(self, spec: ProcessSpec, source: BatchSource, stop: _Stop) -> None:
        self.spec, self.source, self.stop = spec, source, stop
        self.metrics = WorkerMetrics()
        self.metrics.processes.inc()
        self.ctx = zmq.Context()
        self.control = ControlClient(self.ctx, spec.control_endpoint, spec.worker_id, curve=spec.curve)
        self.senders: dict[str, DataSender] = {}  # one per rank's data socket, made when a unit first goes there
        self.works: dict[int, _Work] = {}  # rank -> the unit of it in hand
        self.lease_after = 0.0  # monotonic time before which no lease is asked for
        self.waited = 0.0  # seconds waited for credit since the last batch sent
        self.cpu = CpuAccount()  # the process's CPU, run delay and throttling, batch by batch
        # samples skipped from now on in every unit, beside each lease's own list: those whose transform this
        # process cut short at the time limit, and those the dispatcher made poison while it waited
        self.poison: dict[int, str] = {}
        self.poison_asked_at = 0.0  # when it last asked the dispatcher for them (time.monotonic)

    def run(self) -> int:
        while not self.stop():
            self._hear()
            now = time.monotonic()
            ready = [w for w in self.works.values() if w.sender.credit > 0]
            if ready:
                self._send_next(min(ready, key=_Work.order))
                continue
            if now >= self.lease_after and all(w.blocked(now) for w in self.works.values()):
                answer = self._lease()
                if answer == "finished":
                    return EXIT_FINISHED
                if answer == "other_job":
                    log.warning("%s: the dispatcher serves another job than %s now; leaving it", self.spec.worker_id,
                                self.spec.job.job_id)
                    return EXIT_OTHER_JOB
                continue
            self._wait(min(self.lease_after - now if now < self.lease_after else 0.05, 0.1))
        return EXIT_FINISHED

    # ---- leasing ---------------------------------------------------------------------------
    def _lease(self) -> str:
        spec = self.spec
        activity.note(Phase.LEASING)
        reply = self.control.request(pb.ControlRequest(lease=pb.LeaseRequest(
            host_id=spec.host_id, worker_id=spec.worker_id, holding=[w.unit.unit_id for w in self.works.values()],
            job_id=spec.job.job_id, run_id=spec.run_id)), should_stop=self.stop)
        kind = reply.WhichOneof("kind")
        if kind == "unit":
            self._take(reply.unit)
            self.lease_after = 0.0
        elif kind == "wait":
            pause = reply.wait.retry_after_s
            self.lease_after = time.monotonic() + (max(pause, LEASE_AGAIN_S) if self.works else pause)
        elif kind not in ("finished", "other_job"):
            raise PeerError(f"unexpected reply to a lease request: {reply}")
        return kind

    def _take(self, leased: pb.WorkUnit) -> None:
        """Start on a leased unit. One of a rank this process holds replaces the held one, which the
        dispatcher has taken back in exchange (protos.leases.TRADED). A unit leased again starts
        from its first batch: the rank drops what it already has, and one that restarted meanwhile
        (on the same address) gets all of it."""
        unit = unit_from_proto(leased)
        log.debug("%s: leased unit %d (rank %d)", self.spec.worker_id, unit.unit_id, unit.rank)
        traded = self.works.pop(unit.rank, None)
        if traded is not None:
            traded.sender.end_unit()
        sender = self._sender_for(leased.data_endpoint)
        sender.start_unit(Lease(unit.unit_id, leased.lease_token))
        skip = Skips(ChainMap({s.sample_id: s.reason for s in leased.skip}, self.poison), self._refresh_poison)
        made = self.source.batches(unit, skip, self._hung)
        self.works[unit.rank] = _Work(unit, sender, iter(unsent_part(made, unit.skip, unit.unit_id)))

    def _hung(self, unit_id: int, sample_id: int, seconds: float) -> None:
        """The transform ran past --transform-timeout on a sample: say so now, skip it in every unit this
        process makes from now on, and tell the dispatcher before the batch leaves, so that no unit it
        leases from now on holds it."""
        log.error("%s: the transform ran %.1f s on sample %d of unit %d, past --transform-timeout: the sample is "
                  "skipped, from now on in every epoch (host %s)", self.spec.worker_id, seconds, sample_id, unit_id,
                  self.spec.host_id)
        if len(self.poison) < MAX_POISON_HELD:
            self.poison[sample_id] = f"the transform ran past --transform-timeout on it ({self.spec.worker_id})"
        self.poison_asked_at = 0.0  # others may have hung on samples meanwhile: ask before the next one
        hung = pb.SampleHung(host_id=self.spec.host_id, worker_id=self.spec.worker_id, unit_id=unit_id,
                             sample_id=sample_id, seconds=seconds, run_id=self.spec.run_id)
        try:
            self.control.request(pb.ControlRequest(hung=hung), give_up_after_s=REPORT_GIVE_UP_S,
                                 should_stop=self.stop)
        except DispatcherUnreachable as exc:
            log.warning("%s: could not tell the dispatcher that sample %d hung: %s", self.spec.worker_id, sample_id,
                        exc)

    def _refresh_poison(self) -> None:
        """Before a sample: ask again when a unit has been in hand ASK_POISON_EVERY_S since it was leased or
        since the last ask, and always after this process hung on a sample (others may have meanwhile)."""
        now = time.monotonic()
        if self.works and now - max(min(w.started for w in self.works.values()), self.poison_asked_at) \
                >= ASK_POISON_EVERY_S:
            self.poison_asked_at = now
            self._ask_poison()

    def _ask_poison(self) -> None:
        """The samples of the units in hand that became poison since they were leased (another process hung on
        one meanwhile), so that this process does not wait on them again: asked before a batch of a unit held
        ASK_POISON_EVERY_S, at most that often (a unit is made in well under a second unless it waits)."""
        reply = self.control.request(pb.ControlRequest(poison=pb.PoisonQuery(
            unit_ids=[w.unit.unit_id for w in self.works.values()])), should_stop=self.stop)
        for skip in reply.skips.samples if reply.WhichOneof("kind") == "skips" else ():
            if len(self.poison) < MAX_POISON_HELD:
                self.poison.setdefault(skip.sample_id, skip.reason)

    def _hand_back(self, work: _Work, reason: str) -> None:
        self.works.pop(work.unit.rank, None)
        work.sender.end_unit()
        self.control.request(pb.ControlRequest(release=pb.Release(
            host_id=self.spec.host_id, worker_ids=[self.spec.worker_id], unit_ids=[work.unit.unit_id],
            reason=reason, run_id=self.spec.run_id)), should_stop=self.stop)

    def _sender_for(self, endpoint: str) -> DataSender:
        if endpoint not in self.senders:
            self.senders[endpoint] = DataSender(self.ctx, endpoint, self.spec.host_id, self.spec.worker_id,
                                                self.spec.job.job_id, curve=self.spec.curve)
        return self.senders[endpoint]

    # ---- sending ---------------------------------------------------------------------------
    def _send_next(self, work: _Work) -> None:
        """Make the unit's next batch and send it (its rank holds credit for it)."""
        batch = next(work.batches, None)
        if batch is not None:
            try:
                _send_batch(self.spec, work.unit, batch, work.sender, self.metrics, self.waited, self.stop, self.cpu)
            except LeaseRefused as exc:
                if isinstance(exc, SendTimedOut):
                    self.metrics.sends_timed_out.inc()
                self._refused(work, exc)
                return
            self.waited = 0.0
            work.sent += 1
        if batch is None or batch.header.last_in_unit:
            self.works.pop(work.unit.rank, None)
            work.sender.end_unit()
            self.metrics.units.inc()
            self.lease_after = 0.0  # room for a unit of that rank now: ask at once, not after LEASE_AGAIN_S

    def _refused(self, work: _Work, exc: LeaseRefused) -> None:
        log.warning("%s: unit %d: %s; handing it back", self.spec.worker_id, work.unit.unit_id, exc)
        self._hand_back(work, "lease refused")

    # ---- waiting ---------------------------------------------------------------------------
    def _hear(self) -> None:
        """Every sender takes its replies; a refused lease or a rank gone silent gives its unit back, and
        the connection to a rank that is gone (a job restarted elsewhere) is closed."""
        by_sender = {id(w.sender): w for w in self.works.values()}
        for endpoint, sender in list(self.senders.items()):
            try:
                sender.hear()
            except LeaseRefused as exc:
                work = by_sender.get(id(sender))
                if work is not None:
                    self._refused(work, exc)
            if id(sender) not in by_sender and sender.silent_s() > FORGET_SENDER_S:
                del self.senders[endpoint]
                sender.close()
        for work in list(self.works.values()):
            if work.sender.credit <= 0 and work.sender.silent_s() > UNREACHABLE_S:
                log.warning("%s: rank %d's data socket at %s has said nothing for %.0f s (the rank is gone, or "
                            "this host cannot reach that address: see the rank's data address, --data-bind / "
                            "--advertise-host); handing unit %d back", self.spec.worker_id, work.unit.rank,
                            work.sender.endpoint, work.sender.silent_s(), work.unit.unit_id)
                self._hand_back(work, UNREACHABLE)

    def _wait(self, seconds: float) -> None:
        """Wait on every sender's socket at once (credit, pings, refusals), up to `seconds`."""
        started = time.perf_counter()
        activity.note(Phase.WAITING_FOR_CREDIT if self.works else Phase.IDLE)
        if self.senders:
            poller = zmq.Poller()
            for sender in self.senders.values():
                poller.register(sender.socket, zmq.POLLIN)
            poller.poll(int(seconds * 1000))  # what Poller.poll does with a float (seconds >= 0 here)
        else:
            time.sleep(seconds)
        if self.works:
            waited = time.perf_counter() - started
            self.waited += waited
            self.metrics.credit_wait.inc(waited)

    def close(self) -> None:
        self.metrics.processes.dec()
        for sender in self.senders.values():
            sender.close()
        self.control.close()
        self.cpu.close()
        self.ctx.term()


def _start_threads() -> None:
    """Start, at once, the threads this process will run, before it leases anything: where the host has no
    room for them, RuntimeError here, or zmq's abort (which no handler catches: its I/O thread could not
    start) before a unit is in hand or a batch half sent. First PROBE_THREADS threads held together (as
    many as zmq's and pyzmq's will be), then pyzmq's garbage collector, which otherwise starts with the
    first zero-copy send, with a zmq context and threads of its own."""
    release = threading.Event()
    probes = [threading.Thread(target=release.wait, name="stoker-probe") for _ in range(PROBE_THREADS)]
    try:
        for probe in probes:
            probe.start()
    finally:
        release.set()
        for probe in probes:
            if probe.ident is not None:
                probe.join(timeout=5.0)
    from zmq.utils.garbage import gc
    if not gc.is_alive():
        gc.start()


def _refuse(spec: ProcessSpec, control: ControlClient | None, reason: str) -> int:
    """This host cannot run the job as pinned: say so to the dispatcher, which fails the job with this
    line (the consumer's log and error, its metrics, `stoker status`), and stop for good."""
    log.error("%s: refusing job %s: %s", spec.worker_id, spec.job.job_id, reason)
    ctx = None
    if control is None:
        ctx = zmq.Context()
        control = ControlClient(ctx, spec.control_endpoint, spec.worker_id, curve=spec.curve)
    try:
        control.request(pb.ControlRequest(refuse=pb.Refusal(host_id=spec.host_id, worker_id=spec.worker_id,
                                                            job_id=spec.job.job_id, reason=reason[:REASON_CHARS])),
                        give_up_after_s=REFUSE_GIVE_UP_S)
    except DispatcherUnreachable as exc:
        log.error("%s: could not tell the dispatcher: %s", spec.worker_id, exc)
    finally:
        if ctx is not None:
            control.close()
            ctx.term()
    return EXIT_BAD_JOB


def _send_batch(spec: ProcessSpec, unit: Unit, batch: Outgoing, sender: DataSender, metrics: WorkerMetrics,
                waited: float, stop: Callable[[], bool], account: CpuAccount) -> None:
    """Frame one batch and send it under the credit its rank granted (`waited`: seconds the process
    waited for credit before it, reported in the header). A rank whose connection is gone raises
    SendTimedOut after the sender's deadline, sooner when `stop` says the process is stopping."""
    framing_from = stage_clock()
    header = batch.header
    header.job_id, header.worker_id = spec.job.job_id, spec.worker_id
    header.epoch, header.unit_id = unit.epoch, unit.unit_id
    frames = encode_tensors(header, batch.tensors, checksum=spec.job.checksum)
    stages = header.stages
    stages.wait_for_credit = waited
    stages.send = stage_clock() - framing_from
    cost = account.take()  # the process's CPU since its batch before: this one's whole cost
    stages.cpu, stages.throttled, stages.cores = cost.cpu_s, cost.throttled, cost.cores
    stages.processes, stages.machine, stages.machine_cores = spec.host_procs, cost.machine, cost.machine_cores
    stages.cpu_wait_measured = cost.cpu_wait_s is not None
    stages.cpu_wait = cost.cpu_wait_s or 0.0
    metrics.count_cpu(cost)
    header.created_unix = time.time()
    activity.note(Phase.SENDING, unit.unit_id)
    # numpy's stubs give ndarray its buffer protocol (__buffer__) only from Python 3.12; it has one on 3.11
    nbytes = sender.send(header, frames, should_stop=stop)  # type: ignore[arg-type]
    metrics.batches.inc()
    metrics.bytes_sent.inc(nbytes)
    batch.observe(metrics)


def process_main(spec: ProcessSpec) -> None:
    """multiprocessing target: exit with run_process's code."""
    raise SystemExit(run_process(spec))
