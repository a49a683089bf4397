"""One consumer rank: its sockets, its books and its ordered stream of steps.

An event-loop thread (uvloop + zmq.asyncio) owns the sockets: the rank's data ROUTER (lease
checks, credits, frame checks, duplicate drops, plan order) and either the dispatcher's
control ROUTER (rank 0 of a job whose dispatcher runs in its process) or a link to a
dispatcher elsewhere (`stoker dispatch`, or rank 0's, for every other rank). What a training
loop pulls is `schedule()`: exactly the epoch's steps, in plan order (accel.steps); the
public loader (accel.loader) and `Consumer.run` (the built-in training steps) are the two
ways to pull them, and `run` is written on the loader. Finished steps go back to the loop,
which returns credit and acks completed units.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import uvloop
import zmq
import zmq.asyncio

from accel import checkpoint
from accel.accelerators import NullAccelerator, require
from accel.aio import pump
from accel.batch import ReceivedBatch
from accel.bottleneck import BottleneckMonitor, Totals
from accel.consumer_config import ConsumerConfig
from accel.control.dispatcher import Dispatcher
from accel.control.remote import NotAConsumer, RankRefused, RemoteAcks, attach
from accel.control.server import AccessPolicy, ControlServer, control_router, serve_control
from accel.ledger import Ledger
from accel.metrics import ConsumerMetrics
from accel.receiver import Receiver
from accel.schema import batch_bytes, schema_of
from accel.stepping import StepFactory, given
from accel.steps import EpochDone, Scheduled, StepSchedule
from accel.stream import StreamOrder
from pipeline.shards import Manifest
from protos import job_secret
from protos import stoker_pb2 as pb
from protos.curve import CONSUMER, ClientKeys, ServerKeys
from protos.endpoints import advertised, bind
from protos.framing import MAX_FRAME_BYTES
from protos.job import JobConfig
from protos.leases import LeaseSigner
from protos.sd_notify import Notifier
from protos.sockets import router
from protos.zap import KeyAuthenticator, count_handshakes, monitor_handshakes

log = logging.getLogger("stoker.consumer")
_END = object()


@dataclass
class Summary:
    samples: int
    unique_samples: int
    duplicates_dropped: int
    epochs: int
    elapsed_s: float
    startup_s: float
    delivered_samples_per_s: float
    stall_fraction: float
    batches: int
    hosts: int
    procs_per_host: int
    skipped_samples: int
    skipped: list[dict]
    frames_dropped: dict[str, int]
    units_released: int  # units taken from a lost host (or a stale lease) and made again
    stage_seconds: dict[str, float]
    per_epoch_unique: list[int] = field(default_factory=list)
    dataset: str = "imagenet"
    rank: int = 0
    world_size: int = 1
    steps: int = 0  # steps taken (equal on every rank)
    rows: int = 0  # rows stepped: images, or rows of tokens
    rows_per_s: float = 0.0  # rows stepped per second after start-up: what the device consumed
    bytes_received: int = 0  # tensor bytes that crossed the wire
    time_boxed: bool = False  # stopped by max_seconds before the job was complete
    units_handed_back: int = 0  # units a worker process gave back while waiting for credit: nothing lost
    decode_on: str = "host"  # where JPEGs were decoded; "accelerator": failures there are in `skipped`
    # what bounded the run after start-up (accel.bottleneck's rules over the whole run, not a window)
    bottleneck: str = "unknown"
    bottleneck_detail: str = ""
    cores_needed: float = 0.0  # busy worker processes (at their CPU share here) that keep the device fed
    cores_in_use: float = 0.0  # ... that were busy, on average
    # text only (None for images): BERT examples and tokens stepped, and padding as sent
    sequences: int | None = None
    sequences_per_s: float | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    padding_fraction: float | None = None  # padding share of the token slots that were sent
    padding_fraction_before_packing: float | None = None  # ... had each sequence had its own row
    masked_fraction: float | None = None  # masked-LM targets per real token
    random_next_fraction: float | None = None  # sequences whose B is a random next sentence

    def as_dict(self) -> dict:
        return asdict(self)


class Consumer:
    def __init__(self, cfg: ConsumerConfig, job: JobConfig | None, make_step: StepFactory | None = None,
                 metrics: ConsumerMetrics | None = None, resume: dict | None = None, rank: int = 0,
                 world_size: int | None = None, credential: bytes | None = None) -> None:
        """`job`: the job, for the rank whose process runs the dispatcher; None to take it from the
        dispatcher at `cfg.dispatcher`. `make_step`: the training step, made for the job once it is
        known (default: a null one; a loader's user steps on their own). `resume`: a `state_dict()`
        saved earlier (the same job: its id is taken from it). `world_size` defaults to the job's.
        `credential`: the job secret, when the ranks shared it themselves (accel.ranks); otherwise
        rank 0 takes $STOKER_JOB_SECRET or writes one, and the others read it (protos.job_secret)."""
        cfg.check_exposure()
        self.cfg = cfg
        self.rank = rank
        self.consumer_id = f"rank{rank}-{os.getpid()}-{secrets.token_hex(3)}"
        client_keys = ClientKeys.load(cfg.keys, cfg.key_name, CONSUMER) if cfg.keys and cfg.dispatcher else None
        self._given_credential = credential
        job, lease_key, credential = self._the_job(job, client_keys, world_size)
        position = None
        if resume is not None:
            job, position = checkpoint.resume(job, resume)
        self.job = job
        self.metrics = metrics or ConsumerMetrics()
        self.leases = LeaseSigner(lease_key, job.job_id) if lease_key else LeaseSigner.new(job.job_id)
        self.server_keys = ServerKeys.load(cfg.keys) if cfg.keys else None
        self.manifest = Manifest.load(job.manifest_uri)
        job.check_fits(self.manifest)
        if job.decode_on == "accelerator":
            require("nvidia.dali", "--decode-on accelerator")
        self.accelerator = (make_step or given(NullAccelerator()))(job, self.manifest)
        self.plan = plan = job.plan(self.manifest)
        if position is not None:
            position.check(plan, job.planned_batches if job.kind.one_row_per_sample else None)
            position = self._past_epoch_end(position)
        self.start_position = start = position or checkpoint.Position(0, 0, [(0, 0)] * job.world_size)
        done = start.done_units(plan)
        self.consumer_secret: bytes | None = None
        self.dispatcher = self._make_dispatcher(done, client_keys, credential)
        self._control: ControlServer | None = None
        self.ledger = Ledger(plan, rank)
        self.ledger.restore(set(done))
        units, replay = start.ranks[rank]
        self.order = StreamOrder(plan, rank, start.epoch, units, released=start.step - replay)
        self.queue: queue.Queue = queue.Queue()
        self.data_endpoint = ""
        self.control_endpoint = ""
        self.metrics_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._receiver: Receiver | None = None
        self.position = (start.epoch, start.step)  # (epoch, steps taken in it): what state_dict() saves
        self.progress = Totals()  # the training loop's running counters (stall, step, copy, rows, batches)
        self.bottleneck = BottleneckMonitor(self._totals, self.metrics.registry)
        self.systemd = Notifier()  # Type=notify units: ready once bound, watchdog fed by the event loop

    def _past_epoch_end(self, position: checkpoint.Position) -> checkpoint.Position:
        """A position after an image epoch's last step (a checkpoint of an older Stoker, saved before the
        epoch's end was seen) is the next epoch's start."""
        epoch, job = position.epoch, self.job
        if epoch < job.epochs and job.kind.one_row_per_sample and position.step >= self.steps_of(epoch, 0):
            return checkpoint.Position(epoch + 1, 0, [(0, 0)] * job.world_size)
        return position

    def _the_job(self, job: JobConfig | None, client_keys: ClientKeys | None,
                 world_size: int | None) -> tuple[JobConfig, bytes, bytes]:
        """The job this rank serves (given, or the dispatcher's), its lease key and this rank's credential."""
        lease_key = credential = b""
        if self.cfg.dispatcher:
            if job is not None:
                raise ValueError("with a separate dispatcher the job is the dispatcher's; do not pass one")
            spec, lease_key, credential = self._attach(self.cfg, client_keys, world_size or 0)
            job = JobConfig.from_proto(spec)
        if job is None:
            raise ValueError("give the job, or a dispatcher to take it from (ConsumerConfig.dispatcher)")
        if world_size is not None and world_size != job.world_size:
            if self.cfg.dispatcher:
                raise RankRefused(f"the job has world size {job.world_size}, not {world_size}")
            job = replace(job, world_size=world_size)
        if not 0 <= self.rank < job.world_size:
            raise RankRefused(f"rank {self.rank} is outside the job's ranks 0..{job.world_size - 1}")
        return job, lease_key, credential

    def _make_dispatcher(self, done: frozenset[int], client_keys: ClientKeys | None,
                         credential: bytes) -> Dispatcher | RemoteAcks:
        """Rank 0 runs the dispatcher in-process unless told to attach to one; other ranks attach."""
        cfg, job, plan, start = self.cfg, self.job, self.plan, self.start_position
        if cfg.dispatcher:
            mine = sum(len(plan.rank_units(e, self.rank)) for e in range(job.epochs))
            return RemoteAcks(cfg.dispatcher, self.consumer_id, mine, client_keys, credential,
                              done_before=done, rank=self.rank, world_size=job.world_size)
        if self.rank != 0:
            raise RankRefused(f"rank {self.rank} attaches to rank 0's dispatcher: give its endpoint (--dispatcher)")
        dispatcher = Dispatcher(plan, cfg.host_timeout_s, on_release=self._count_release, done_before=done,
                                planned_batches=job.planned_batches if job.kind.one_row_per_sample else None)
        dispatcher.resume_position(start.epoch, start.ranks, start.step)
        if job.world_size > 1 and not cfg.keys:  # the other ranks attach with the job secret
            self.consumer_secret = self._given_credential or job_secret.for_rank_zero(cfg.job_secret,
                                                                                      cfg.control_bind)
        return dispatcher

    def _attach(self, cfg: ConsumerConfig, keys: ClientKeys | None, world_size: int) -> tuple[pb.JobSpec, bytes, bytes]:
        """The job from the dispatcher. Without keys a rank proves itself with the job secret, which
        rank 0 may still be writing: a refusal is retried for a while with the secret read again."""
        deadline = time.monotonic() + min(30.0, cfg.attach_timeout_s)
        given = self._given_credential
        while True:
            credential = b"" if cfg.keys else given or self._read_secret(deadline)
            try:
                spec, lease_key = attach(cfg.dispatcher, self.consumer_id, keys, credential, rank=self.rank,
                                         world_size=world_size, timeout_s=cfg.attach_timeout_s)
                return spec, lease_key, credential
            except NotAConsumer:
                if cfg.keys or given or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _read_secret(self, deadline: float) -> bytes:
        """The job secret from $STOKER_JOB_SECRET or rank 0's file, waiting (until `deadline`) while the file
        is not there yet or is being replaced."""
        while True:
            try:
                return job_secret.for_consumer(self.cfg.job_secret, self.cfg.dispatcher,
                                               wait_s=max(0.0, deadline - time.monotonic()))
            except job_secret.UntrustedSecret:
                raise  # planted or open to others: waiting would not make it ours
            except job_secret.JobSecretError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _totals(self) -> Totals:
        """A snapshot for the bottleneck monitor: the loop's counters plus what the workers reported."""
        p = self.progress
        stages = self._receiver.stages if self._receiver else None
        work = {} if stages is None else {name: getattr(stages, name) for name in self.job.kind.stages}
        if stages is not None:
            work["send"] = stages.send
        return Totals(at=time.monotonic(), stall_s=p.stall_s, step_s=p.step_s, copy_s=p.copy_s, rows=p.rows,
                      batches=p.batches, received_batches=stages.batches if stages else 0,
                      transit_s=stages.transit if stages else 0.0,
                      wait_for_credit_s=stages.wait_for_credit if stages else 0.0, work_s=work,
                      queue_depth=self.queue.qsize())

    def _count_release(self, reason: str, units: int) -> None:
        self.metrics.releases.labels(reason=reason).inc(units)

    # ---- start-up -----------------------------------------------------------------------
    def start(self) -> None:
        """Bind sockets and the metrics endpoint; raise here if a port is taken. Idempotent."""
        if self._thread is not None:
            return
        if self.cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_addr)
        self._thread = threading.Thread(target=self._run_loop, name="stoker-receive", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        self.bottleneck.start()
        self.systemd.ready(f"serving {self.data_endpoint}")
        if self.order.done:  # resumed from a checkpoint of a finished job
            self.queue.put(_END)

    def _run_loop(self) -> None:
        loop = uvloop.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to the main thread
            self._error = exc
            self._ready.set()
            self.queue.put(_END)
        finally:
            loop.close()

    async def _serve(self) -> None:
        ctx = zmq.asyncio.Context()
        keys = self.server_keys
        authenticator = KeyAuthenticator(ctx, keys) if keys else None
        if authenticator is not None:
            authenticator.start()  # before any bind
        data = router(ctx, MAX_FRAME_BYTES + (1 << 20), keys, receive_hwm=10_000)
        control = None
        tasks = []
        try:
            if keys:
                tasks.append(count_handshakes(monitor_handshakes(data), self.metrics.auth, self._stop))
            self.data_endpoint = advertised(bind(data, self.cfg.data_bind, "data"), self.cfg.advertise_host)
            self._receiver = Receiver(data, self.job.job_id, self.cfg.credit_window, self.ledger, self.queue,
                                      self.metrics, self._unit_done, schema_of(self.job), self.leases, self.order,
                                      keyed=keys is not None, sender_timeout_s=self.cfg.sender_timeout_s,
                                      on_unit_received=self.dispatcher.received,
                                      on_unit_short=self.dispatcher.redo,
                                      budget=self._credit_budget())
            tasks += [pump(data, self._receiver.handle, self._stop), self._sweep_senders()]
            if isinstance(self.dispatcher, RemoteAcks):
                self.control_endpoint = self.cfg.dispatcher or ""
                self.dispatcher.data_endpoint = self.data_endpoint
                self.dispatcher.on_finished = lambda: None
                tasks.append(self.dispatcher.run(ctx, self._stop))
            else:
                control, monitor = control_router(ctx, keys)
                self.control_endpoint = advertised(bind(control, self.cfg.control_bind, "control"),
                                                   self.cfg.advertise_host)
                self.dispatcher.attach_rank(0, self.data_endpoint, self.consumer_id)
                access = AccessPolicy(keyed=keys is not None, consumer_secret=self.consumer_secret,
                                      remote_consumers=self.job.world_size > 1)
                server = self._control = ControlServer(control, self.dispatcher, self.job.to_proto(self.data_endpoint),
                                                       self.metrics, self.leases, access)
                server.update_gauges()
                tasks += serve_control(control, monitor, server, self._stop)
            tasks.append(self._feed_watchdog())
            self._ready.set()
            await asyncio.gather(*tasks)
        finally:
            data.close(0)
            if control is not None:
                control.close(0)
            if authenticator is not None:
                authenticator.stop()
            ctx.term()

    def _credit_budget(self) -> int:
        """Batches the rank may hold in all (in flight or waiting here), from its byte budget."""
        nbytes = max(1, batch_bytes(self.job))
        return max(2 * self.cfg.credit_window, int(self.cfg.credit_budget_mb * (1 << 20)) // nbytes)

    async def _sweep_senders(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self._receiver.sweep_every_s if self._receiver else 1.0)
            if self._receiver is not None:
                self._receiver.sweep()
            if isinstance(self.dispatcher, Dispatcher):
                self.dispatcher.rank_heard(0, self.consumer_id)

    async def _feed_watchdog(self) -> None:
        while not self._stop.is_set():
            self.systemd.watchdog()
            await asyncio.sleep(1.0)

    def _unit_done(self, unit_id: int, batches: int) -> None:
        self.dispatcher.ack(unit_id, batches)
        if self.order.done and self.ledger.open_units == 0:
            self.queue.put(_END)

    def abort(self, error: BaseException) -> None:
        """End the stream from another thread: whoever pulls it gets `error` after the current step."""
        self._error = error
        self.queue.put(_END)

    # ---- the stream of steps -------------------------------------------------------------
    def schedule(self) -> StepSchedule:
        """Exactly the steps of every epoch from the start position, in plan order."""
        start = self.start_position
        units, replay = start.ranks[self.rank]
        return StepSchedule(self._next, _END, self.steps_of, self._replayed, start.epoch, start.step - replay, replay)

    def steps_of(self, epoch: int, batches: int) -> int:
        """The epoch's steps on every rank: the longest rank stream (images: from the plan alone)."""
        if self.job.kind.one_row_per_sample:
            return self.plan.step_offset(epoch) + max(sum(self.job.planned_batches(u) for u in
                                                          self.plan.rank_units(epoch, r))
                                                      for r in range(self.job.world_size))
        waited_from = time.monotonic()
        while True:
            steps = self._ask_epoch_steps(epoch, batches)
            if steps is not None:
                return steps
            if self._stop.is_set() or (self._thread is not None and not self._thread.is_alive()):
                raise RuntimeError("stopped while waiting for the other ranks")
            if time.monotonic() - waited_from > 10:
                log.warning("rank %d: waiting for the other ranks to finish epoch %d", self.rank, epoch)
                waited_from = time.monotonic()
            time.sleep(0.05)

    def _ask_epoch_steps(self, epoch: int, batches: int) -> int | None:
        if isinstance(self.dispatcher, Dispatcher):
            return self._on_loop(lambda: self.dispatcher.epoch_steps(epoch, self.rank, batches))
        reply = self._on_loop_async(self.dispatcher.call(pb.ControlRequest(epoch_steps=pb.EpochSteps(
            epoch=epoch, rank=self.rank, batches=batches)), self._stop))
        return reply.steps.steps if reply is not None and reply.WhichOneof("kind") == "steps" else None

    def _replayed(self, batch: ReceivedBatch) -> None:
        assert self._loop is not None and self._receiver is not None
        self._loop.call_soon_threadsafe(self._receiver.step_done, batch, True)

    def taken(self, step: Scheduled) -> None:
        """A step's batch went to the training loop: the data position is past it (past the epoch's last
        step: the next epoch's start, so a checkpoint taken there resumes with the next epoch)."""
        self.position = (step.epoch + 1, 0) if step.last else (step.epoch, step.step + 1)

    def step_done(self, step: Scheduled) -> None:
        """A step is over: its batch's books close when it was the batch's last piece."""
        assert self._loop is not None and self._receiver is not None
        if step.closes is not None:
            self._loop.call_soon_threadsafe(self._receiver.step_done, step.closes)

    def epoch_done(self, end: EpochDone) -> None:
        self.position = (end.epoch + 1, 0)

    def _next(self) -> object:
        while True:
            try:
                item = self.queue.get(timeout=0.5)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive():
                    return _END
                continue
            if item is _END and self._error is not None:
                raise self._error
            return item

    # ---- the built-in training loop -------------------------------------------------------
    def run(self, on_step: Callable[[Consumer], None] | None = None, procs_per_host: int = 0,
            max_seconds: float | None = None) -> Summary:
        """Step the accelerator through every batch of the job; returns the closing summary.

        `max_seconds`: stop after that long past the first batch (a time-boxed measurement, as
        `stoker sweep` makes; the job is then not complete and `time_boxed` says so)."""
        from accel.training_loop import train

        return train(self, on_step=on_step, procs_per_host=procs_per_host, max_seconds=max_seconds)

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The job's data position after the steps taken so far, for every rank (see accel.checkpoint)."""
        epoch, step = self.position
        if epoch >= self.job.epochs:
            ranks = [(0, 0)] * self.job.world_size
        elif isinstance(self.dispatcher, Dispatcher):
            ranks = self._on_loop(lambda: self.dispatcher.position(epoch, step))
        else:
            reply = self._on_loop_async(self.dispatcher.call(pb.ControlRequest(
                position=pb.PositionQuery(epoch=epoch, step=step)), self._stop))
            if reply is None:
                raise RuntimeError("stopped before the dispatcher said where the ranks stand")
            ranks = [(r.units, r.batches) for r in reply.position.ranks]
        return checkpoint.state(self.job, epoch, step, ranks, self.ledger.samples)

    def settle(self) -> None:
        """Wait until the event loop has done the book-keeping of every step handed back so far."""
        if self._thread is not None and self._thread.is_alive():
            self._on_loop(lambda: None)

    def _on_loop(self, read: Callable[[], object]) -> object:
        """Run `read` on the event loop (which owns the books) and return its result."""
        assert self._loop is not None
        result: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            try:
                result.set_result(read())
            except BaseException as exc:  # handed to the caller
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return result.result(timeout=10)

    def _on_loop_async(self, coroutine) -> object:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def stop(self) -> None:
        """Close everything. Rank 0 with the job's dispatcher first waits (a while) for the other
        ranks to finish, and gives live hosts a moment to hear that the job is finished."""
        server = self._control
        alive = self._thread is not None and self._thread.is_alive()
        if server is not None and alive and self.order.done:  # the last acks may still be on the loop
            wait_s = self.cfg.rank_wait_s if self.job.world_size > 1 else self.cfg.finish_linger_s
            deadline = time.monotonic() + wait_s
            while not self._on_loop(lambda: self.dispatcher.finished) and time.monotonic() < deadline:
                time.sleep(0.05)
        if server is not None and alive and self.dispatcher.finished:
            deadline = time.monotonic() + self.cfg.finish_linger_s
            while self._on_loop(server.hosts_not_told) and time.monotonic() < deadline:
                time.sleep(0.05)
        if isinstance(self.dispatcher, RemoteAcks) and alive:  # acks still on their way must arrive
            deadline = time.monotonic() + self.cfg.finish_linger_s
            while self._on_loop(lambda: bool(self.dispatcher.unsent)) and time.monotonic() < deadline:
                time.sleep(0.02)
        self._stop.set()
        self.bottleneck.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
