"""The consumer (`stoker train`): receive on an event loop, step on the main thread.

An event-loop thread (uvloop + zmq.asyncio) owns both sockets: the data ROUTER (credits,
checks, duplicate drops, into the prefetch queue) and the dispatcher's control ROUTER. The
main thread takes batches from the queue and runs the accelerator's step, so receiving the
next batches overlaps the current step. Finished steps go back to the loop, which returns
credit and acks completed units to the in-process dispatcher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import uvloop
import zmq
import zmq.asyncio

from accel import checkpoint
from accel.accelerators import Accelerator
from accel.aio import pump
from accel.batch import ReceivedBatch
from accel.bottleneck import BottleneckMonitor, Totals
from accel.control_server import AccessPolicy, ControlServer, control_router, ticker
from accel.dispatcher import Dispatcher
from accel.job import JobConfig, job_from_spec
from accel.ledger import Ledger
from accel.metrics import ConsumerMetrics
from accel.prefetch import Prefetcher
from accel.receiver import Receiver
from accel.remote_dispatcher import RemoteAcks, attach
from accel.schema import schema_of
from accel.zap import KeyAuthenticator, count_handshakes, monitor_handshakes
from pipeline.plan import EpochPlan
from pipeline.shards import Manifest
from pipeline.text.vocab import Vocab
from protos import job_secret
from protos.curve import CONSUMER, ClientKeys, ServerKeys, is_loopback
from protos.endpoints import advertised, bind
from protos.framing import MAX_FRAME_BYTES
from protos.leases import LeaseSigner
from protos.sd_notify import Notifier

log = logging.getLogger("stoker.consumer")
_END = object()


@dataclass(frozen=True)
class ConsumerConfig:
    data_bind: str = "tcp://127.0.0.1:5560"
    control_bind: str = "tcp://127.0.0.1:5561"
    advertise_host: str | None = None  # host name workers use to reach this machine
    metrics_port: int | None = 9560  # None: no HTTP endpoint
    metrics_addr: str = "127.0.0.1"
    credit_window: int = 3  # batches in flight per worker process
    overlap: bool = True  # convert/copy batch N+1 on a side thread while step N runs
    host_timeout_s: float = 10.0
    dispatcher: str | None = None  # a `stoker dispatch` endpoint; None: the dispatcher runs in this process
    key_name: str = "consumer"  # with keys and a separate dispatcher: this consumer's key (keys add --role consumer)
    job_secret: str | None = None  # without keys and with a separate dispatcher: the job credential's file
    keys: str | None = None  # CURVE key folder (stoker keys init): encrypt, admit allow-listed workers only
    insecure: bool = False  # allow binding non-loopback addresses without keys
    decode_threads: int = 1  # --decode-on accelerator: DALI's CPU threads on the consumer
    sender_timeout_s: float = 30.0  # free the credit window of a sender that answers no ping this long
    finish_linger_s: float = 3.0  # after the last ack, keep answering until every live host heard "finished"

    def check_exposure(self) -> None:
        """Without keys, refuse to listen beyond loopback unless told to."""
        if self.keys or self.insecure:
            return
        for endpoint in (self.data_bind, self.control_bind, f"tcp://{self.metrics_addr}:0"):
            if not is_loopback(endpoint):
                raise ValueError(f"refusing to bind {endpoint} without CURVE keys: anyone who can reach it could "
                                 f"feed or steal batches or read the job's metrics; make keys with `stoker keys init "
                                 f"DIR` and pass --keys DIR, or pass --insecure on a trusted network")


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
    units_released: int
    stage_seconds: dict[str, float]
    per_epoch_unique: list[int] = field(default_factory=list)
    dataset: str = "imagenet"
    rows: int = 0  # rows stepped: images, or rows of tokens
    rows_per_s: float = 0.0  # rows stepped per second after start-up: what the device consumed
    bytes_received: int = 0  # tensor bytes that crossed the wire
    time_boxed: bool = False  # stopped by max_seconds before the job was complete
    decode_on: str = "host"  # where JPEGs were decoded; "accelerator": failures there are in `skipped`
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


def check_dataset(job: JobConfig, manifest: Manifest) -> None:
    """Fail at start-up, with the fix, when the shards do not fit the job."""
    if job.dataset == "wikipedia":
        if not manifest.vocab:
            raise ValueError(f"{manifest.uri} holds {manifest.kind!r} shards, not text: "
                             f"make text shards with `stoker prepare wikipedia`")
        Vocab.load(manifest.relative_uri(manifest.vocab))  # raises VocabError (a ValueError) if unusable
    elif manifest.kind != "imagenet":
        raise ValueError(f"{manifest.uri} holds {manifest.kind!r} shards; run with --dataset {manifest.kind}")


class Consumer:
    def __init__(self, cfg: ConsumerConfig, job: JobConfig | None, accelerator: Accelerator,
                 metrics: ConsumerMetrics | None = None, resume: dict | None = None) -> None:
        """`resume`: a `state_dict()` saved earlier; the job must be the same (its id is taken from it).
        With `cfg.dispatcher` the job comes from that dispatcher and `job` must be None."""
        cfg.check_exposure()
        client_keys = ClientKeys.load(cfg.keys, cfg.key_name, CONSUMER) if cfg.keys and cfg.dispatcher else None
        credential = job_secret.for_consumer(cfg.job_secret) if cfg.dispatcher and not cfg.keys else b""
        lease_key = b""
        if cfg.dispatcher:
            if job is not None:
                raise ValueError("with a separate dispatcher the job is the dispatcher's; do not pass one")
            spec, lease_key = attach(cfg.dispatcher, cfg.key_name, client_keys, credential)
            job = job_from_spec(spec)
        assert job is not None
        if resume is not None:
            checkpoint.check_matches(job, resume)
            job = replace(job, job_id=resume["job"]["job_id"])
        self.cfg = cfg
        self.job = job
        self.accelerator = accelerator
        self.metrics = metrics or ConsumerMetrics()
        self.decoding = None  # --decode-on accelerator: the decoder wrapped around the accelerator, made by run()
        self.leases = LeaseSigner(lease_key, job.job_id) if lease_key else LeaseSigner.new(job.job_id)
        self.server_keys = ServerKeys.load(cfg.keys) if cfg.keys else None
        self.manifest = Manifest.load(job.manifest_uri)
        check_dataset(job, self.manifest)
        plan = EpochPlan(self.manifest, job.unit_size, job.epochs, job.seed)
        done = frozenset(resume["done_units"]) if resume else frozenset()
        self.dispatcher: Dispatcher | RemoteAcks
        if cfg.dispatcher:
            total = sum(len(plan.units(e)) for e in range(job.epochs))
            self.dispatcher = RemoteAcks(cfg.dispatcher, cfg.key_name, total, client_keys, credential,
                                         done_before=done)
            self.dispatcher.on_finished = lambda: self.queue.put(_END)
        else:
            self.dispatcher = Dispatcher(plan, cfg.host_timeout_s, on_release=self._count_release, done_before=done)
        self._control: ControlServer | None = None
        self.ledger = Ledger(plan)
        if resume:
            self.ledger.restore(set(done), resume["in_progress"])
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
        self.progress = Totals()  # the training loop's running counters (stall, step, copy, rows, batches)
        self.bottleneck = BottleneckMonitor(self._totals, self.metrics.registry)
        self.systemd = Notifier()  # Type=notify units: ready once bound, watchdog fed by the event loop

    def _decoding(self, accelerator: Accelerator):
        """Wrap the accelerator so each batch's JPEGs are decoded where it runs (DALI)."""
        from accel.jpeg_decode import DaliJpegDecoder, DecodingAccelerator

        def count(seconds: float, failed: int, fallbacks: int) -> None:
            self.metrics.accel_decode.observe(seconds)
            self.metrics.accel_decode_errors.inc(failed)
            self.metrics.accel_decode_fallbacks.inc(fallbacks)

        device = str(getattr(accelerator, "device", "cpu"))
        decoder = DaliJpegDecoder(self.job.image_size, self.job.batch_size, device, self.cfg.decode_threads)
        return DecodingAccelerator(accelerator, decoder, on_decode=count, key_of=self.manifest.key_of)

    def _totals(self) -> Totals:
        """A snapshot for the bottleneck monitor: the loop's counters plus what the workers reported."""
        p = self.progress
        stages = self._receiver.stages if self._receiver else None
        work = {} if stages is None else {name: getattr(stages, name) for name in
                                          (("examples", "pack") if self.job.dataset == "wikipedia"
                                           else ("decode", "augment"))}
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
        if self.dispatcher.finished:  # resumed from a checkpoint of a finished job
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
        data = ctx.socket(zmq.ROUTER)
        control = None
        tasks = []
        try:
            data.setsockopt(zmq.ROUTER_MANDATORY, 1)
            data.setsockopt(zmq.LINGER, 0)
            if keys:
                keys.apply(data)
                tasks.append(count_handshakes(monitor_handshakes(data), self.metrics, self._stop))
            data.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + (1 << 20))
            data.setsockopt(zmq.RCVHWM, 10_000)
            self.data_endpoint = advertised(bind(data, self.cfg.data_bind, "data"), self.cfg.advertise_host)
            self._receiver = Receiver(data, self.job.job_id, self.cfg.credit_window, self.ledger, self.queue,
                                      self.metrics, self._unit_done, schema_of(self.job), self.leases,
                                      keyed=keys is not None, on_unit_incomplete=self._unit_incomplete,
                                      sender_timeout_s=self.cfg.sender_timeout_s)
            tasks += [pump(data, self._receiver.handle, self._stop), self._sweep_senders()]
            if isinstance(self.dispatcher, RemoteAcks):
                self.control_endpoint = self.cfg.dispatcher or ""
                tasks.append(self.dispatcher.run(ctx, self._stop))
            else:
                control = control_router(ctx, keys)
                if keys:
                    tasks.append(count_handshakes(monitor_handshakes(control), self.metrics, self._stop))
                self.control_endpoint = advertised(bind(control, self.cfg.control_bind, "control"),
                                                   self.cfg.advertise_host)
                server = self._control = ControlServer(control, self.dispatcher, self.job.spec(self.data_endpoint),
                                                       self.metrics, self.leases, AccessPolicy(keyed=keys is not None))
                server.update_gauges()
                tasks += [pump(control, server.handle, self._stop), ticker(server, self._stop)]
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

    async def _sweep_senders(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(1.0)
            if self._receiver is not None:
                self._receiver.sweep()

    async def _feed_watchdog(self) -> None:
        while not self._stop.is_set():
            self.systemd.watchdog()
            await asyncio.sleep(1.0)

    def _unit_done(self, unit_id: int) -> None:
        self.dispatcher.ack(unit_id)
        if isinstance(self.dispatcher, Dispatcher) and self.dispatcher.finished:
            self.queue.put(_END)

    def _unit_incomplete(self, unit_id: int) -> None:
        """Its batches did not account for its samples: hand it out again (a separate dispatcher
        re-leases it when the lease expires)."""
        if isinstance(self.dispatcher, Dispatcher):
            self.dispatcher.release_unit(unit_id, "incomplete")

    def abort(self, error: BaseException) -> None:
        """End `run` from another thread: it raises `error` once the current step is done."""
        self._error = error
        self.queue.put(_END)

    # ---- training loop ------------------------------------------------------------------
    def run(self, on_step: Callable[[Consumer], None] | None = None, procs_per_host: int = 0,
            max_seconds: float | None = None) -> Summary:
        """Step through every batch of the job; returns the closing summary.

        `max_seconds`: stop after that long past the first batch (a time-boxed measurement, as
        `stoker sweep` makes; the job is then not complete and `time_boxed` says so)."""
        if self._loop is None:
            self.start()
        assert self._loop is not None and self._receiver is not None
        started = time.perf_counter()
        startup = 0.0
        sequences = tokens = 0
        p = self.progress = Totals()  # stall, step, copy, rows and batches: read by the bottleneck monitor too
        first = True
        time_boxed = False
        if self.job.decode_on == "accelerator" and self.decoding is None:
            self.decoding = self._decoding(self.accelerator)
        stepper = self.decoding or self.accelerator
        prepare = getattr(stepper, "prepare", None)

        def record_copy(seconds: float) -> None:
            p.copy_s += seconds
            self.metrics.device_copy.observe(seconds)

        def prepare_rows(batch: ReceivedBatch) -> object:  # a unit's last batch can be empty: nothing to convert
            return prepare(batch) if batch.size else None

        prefetcher = Prefetcher(self._next, prepare_rows, _END, record_copy) if prepare and self.cfg.overlap else None
        while True:
            waited_from = time.perf_counter()
            item, prepared = prefetcher.next() if prefetcher else (self._next(), None)
            waited = time.perf_counter() - waited_from
            if item is _END:
                break
            batch: ReceivedBatch = item
            if first:
                startup, first = waited, False
            else:
                p.stall_s += waited
                self.metrics.input_wait.observe(waited)
            if prepare and prefetcher is None and batch.size:  # serial: convert and copy between steps
                copy_from = time.perf_counter()
                prepared = prepare(batch)
                record_copy(time.perf_counter() - copy_from)
            step_from = time.perf_counter()
            if batch.size:
                if prepare:
                    stepper.step_prepared(prepared)
                else:
                    stepper.step(batch)
            step_s = time.perf_counter() - step_from
            self.metrics.step_seconds.observe(step_s)
            self.metrics.samples.inc(batch.size)
            self.metrics.batches.inc()
            p.step_s += step_s
            p.rows += batch.size - len(batch.undecodable)
            p.batches += 1
            if batch.sequences:
                sequences += batch.sequences
                tokens += batch.real_tokens
                self.metrics.sequences.inc(batch.sequences)
                self.metrics.tokens.inc(batch.real_tokens)
            self._loop.call_soon_threadsafe(self._receiver.step_done, batch)
            if on_step:
                on_step(self)
            if max_seconds is not None and time.perf_counter() - started - startup >= max_seconds:
                time_boxed = True
                break
        if self._error is not None:
            raise self._error
        elapsed = time.perf_counter() - started
        steady = max(elapsed - startup, 1e-9)
        stages = self._receiver.stages
        skipped = sorted(self.ledger.skipped.values(), key=lambda s: (s.epoch, s.sample_id))
        text = self._receiver.text
        work = ({"examples": stages.examples, "pack": stages.pack} if self.job.dataset == "wikipedia"
                else {"decode": stages.decode, "augment": stages.augment})
        if self.decoding:  # part of "copy": the consumer's prepare decodes before it converts
            work["decode_on_accelerator"] = self.decoding.decode_s
        text_fields = {} if self.job.dataset != "wikipedia" else dict(
            sequences=sequences, sequences_per_s=sequences / steady, tokens=tokens, tokens_per_s=tokens / steady,
            padding_fraction=text.padding_fraction,
            padding_fraction_before_packing=text.padding_fraction_before_packing,
            masked_fraction=text.masked_tokens / text.real_tokens if text.real_tokens else 0.0,
            random_next_fraction=text.random_next / text.sequences if text.sequences else 0.0)
        return Summary(
            samples=self.ledger.samples,
            unique_samples=self.ledger.unique_samples,
            duplicates_dropped=self.ledger.duplicate_samples,
            epochs=self.job.epochs,
            elapsed_s=elapsed,
            startup_s=startup,
            delivered_samples_per_s=self.ledger.samples / steady,
            stall_fraction=p.stall_s / steady,
            batches=p.batches,
            hosts=len(self._receiver.hosts_delivered),
            procs_per_host=procs_per_host,
            skipped_samples=len(skipped),
            skipped=[asdict(s) for s in skipped],
            frames_dropped=dict(self._receiver.dropped),
            units_released=self.dispatcher.stats().releases,
            stage_seconds={**work, "send": stages.send, "wait_for_credit": stages.wait_for_credit,
                           "receive": stages.receive, "copy": p.copy_s, "step": p.step_s, "stall": p.stall_s},
            per_epoch_unique=[self.ledger.unique_in_epoch(e) for e in range(self.job.epochs)],
            dataset=self.job.dataset,
            rows=p.rows,
            rows_per_s=p.rows / steady,
            bytes_received=self._receiver.bytes_received,
            time_boxed=time_boxed,
            decode_on=self.job.decode_on,
            **text_fields,
        )

    def state_dict(self) -> dict:
        """The data position after every step so far (see accel.checkpoint); call between steps.

        It is read on the event loop after the credits of finished steps are settled, so it
        counts exactly the steps that have returned."""
        return self._on_loop(lambda: {
            "version": checkpoint.STATE_VERSION, "job": checkpoint.job_fields(self.job),
            "done_units": self.dispatcher.done_units(), "in_progress": self.ledger.position(),
            "samples_stepped": self.ledger.samples})

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

    def _next(self) -> object:
        while True:
            try:
                return self.queue.get(timeout=0.5)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive():
                    return _END

    def stop(self) -> None:
        """Close everything; after a finished job, first give live hosts a moment to hear that it is."""
        server = self._control
        if server is not None and self.dispatcher.finished and self._thread is not None and self._thread.is_alive():
            deadline = time.monotonic() + self.cfg.finish_linger_s
            while self._on_loop(server.hosts_not_told) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._stop.set()
        self.bottleneck.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
