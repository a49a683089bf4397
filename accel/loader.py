"""The loader a training script pulls from: `for batch in loader:`, one epoch per pass.

Each rank of a data-parallel job makes one Loader (who it is and where it listens: accel.ranks,
from its arguments, torchrun's environment, or an initialised torch.distributed or
jax.distributed). Rank 0 runs the job's dispatcher in its process unless `config.dispatcher`
names one elsewhere, and tells the other ranks where it is, with the job secret, through the
process group's store; they attach to it. Every
rank gets its own stream of batches, in plan order, and the same number of steps per epoch
(accel.steps), so `len(loader)` is this rank's steps per epoch and a DDP step never waits
for a rank that has run out. Each batch is a mapping of tensor name to array:

- `format="torch"` (default): torch tensors on `device`; on CUDA through pinned memory on a
  side stream, ordered by an event, so the copy of batch N+1 overlaps step N;
- `format="numpy"`: NumPy views of the received frames (no copy), for any framework;
- `format="jax"`: `jax.device_put` arrays, where jax is installed.

Images are uint8 NHWC (`image`) and int32 labels (`label`), normalised on the device by the
step that uses them; with decoding on the accelerator the loader decodes (NVIDIA DALI) before
converting. `batch.rows` says how many rows a batch holds (a rank's last batch of an epoch
may be short, never padded); `batch.sample_ids` which samples they are.

`state_dict()` is the job's data position after the batches yielded so far, the same on
every rank (accel.checkpoint); `load_state_dict()` before the first pass continues from it.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from accel.batch import ReceivedBatch
from accel.consumer import Consumer
from accel.consumer_config import ConsumerConfig
from accel.metrics import ConsumerMetrics
from accel.ranks import (
    HOST_ENV,
    Meeting,
    Rendezvous,
    RendezvousTimeout,
    default_config,
    meeting_key,
    place,
    rank_zero_dispatcher,
    rendezvous,
)
from accel.steps import EpochDone, Scheduled
from protos.job import JobConfig

FORMATS = ("torch", "numpy", "jax")
REACH_S = 10.0  # a rank that knows rank 0's dispatcher is up gives up reaching it after this long


@dataclass
class Batch(Mapping):
    """One step: tensor name -> array, with what the step needs to know about it."""

    tensors: dict[str, Any]
    rows: int  # rows it holds (images, or rows of tokens); the batch size but at an epoch's end
    epoch: int
    step: int  # within the epoch, from 0
    sample_ids: np.ndarray  # images: one per row; text: the documents first seen in this batch
    received: ReceivedBatch = field(repr=False)
    prepared: object = field(default=None, repr=False)  # the `prepare` hook's result, when there is one
    copy_s: float = 0.0  # conversion and host-to-device copy
    ready: object = field(default=None, repr=False)  # CUDA: the event the copy stream recorded

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


class Loader:
    def __init__(self, job: JobConfig | None = None, *, config: ConsumerConfig | None = None,
                 rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
                 device: str = "cpu", format: str = "torch", overlap: bool = True,
                 prepare: Callable[[ReceivedBatch], object] | None = None,
                 metrics: ConsumerMetrics | None = None, keys: str | None = None,
                 insecure: bool | None = None) -> None:
        """`job`: rank 0's (it runs the dispatcher); other ranks may pass it too and get the job from
        the dispatcher. Rank, world size and local rank: the arguments, else torchrun's environment,
        else an initialised torch.distributed or jax.distributed (accel.ranks).
        `config`: sockets, keys, credit. Default: this node's address (loopback on one machine;
        on several, the address that routes to $MASTER_ADDR, or $STOKER_HOST), the data socket on a
        free port, the dispatcher on port 5561, /metrics on 9560 for local rank 0 and 9570 + local
        rank for the others; `keys` (or $STOKER_KEYS) a CURVE key folder, `insecure` (or
        $STOKER_INSECURE=1) to listen beyond loopback without keys. With an initialised process group
        the other ranks learn rank 0's dispatcher and the job secret through its store.
        `prepare`: run on the prefetch thread on each received batch instead of the format
        conversion (the built-in training steps use it); its result is `batch.prepared`."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
        where = place(rank, world_size, local_rank)
        self.rank, self.world_size, self.local_rank = where.rank, where.world_size, where.local_rank
        if config is not None and (keys is not None or insecure is not None):
            raise ValueError("give keys and insecure in the ConsumerConfig when you give one")
        cfg = config or default_config(where, keys, insecure)
        try:
            cfg.check_exposure()  # at construction: a rank that cannot listen where it must says so at once
        except ValueError as exc:
            if config is not None:
                raise
            raise ValueError(f"rank {self.rank}: this job's ranks are on several machines ($MASTER_ADDR="
                             f"{where.master_addr} is not this machine's loopback), so this rank listens where the "
                             f"others and the workers reach it; {exc}") from None
        self._meeting_key = meeting_key() if self.world_size > 1 and not cfg.dispatcher else None
        self._master_addr = where.master_addr
        if self.rank and job is not None and not config:
            job = None  # every rank may be handed the job; only rank 0's (or the dispatcher's) counts
        if job is not None and job.world_size != self.world_size:
            job = replace(job, world_size=self.world_size)
        self.cfg = cfg
        self.job_config = job
        self.device = device
        self.format = format
        self.overlap = overlap
        self.prepare = prepare
        self.metrics = metrics
        self._resume: dict | None = None
        self._consumer: Consumer | None = None
        self._schedule = None
        self._ahead: queue.Queue | None = None
        self._prefetch: threading.Thread | None = None
        self._pending: Scheduled | None = None  # yielded and not yet handed back
        self._epoch_steps: dict[int, int] = {}
        self._converter: _Converter | None = None
        self._closed = False

    # ---- the consumer behind it ------------------------------------------------------------
    @property
    def consumer(self) -> Consumer:
        """The rank's consumer (made, bound and attached on first use)."""
        if self._consumer is None:
            if self._closed:
                raise RuntimeError("the loader is closed")
            self._consumer = self._make_consumer()
        return self._consumer

    def _make_consumer(self) -> Consumer:
        """Rank 0 (with the job's dispatcher) binds, then tells the other ranks where it is and the job
        secret through the launcher's store; the others wait for that and attach. Without a store
        they find rank 0 at $MASTER_ADDR and the secret in $STOKER_JOB_SECRET or rank 0's file."""
        store = rendezvous() if self._meeting_key else None
        keyed = bool(self.cfg.keys)
        if self.rank == 0 and not self.cfg.dispatcher:
            secret = None if store is None or keyed else secrets.token_hex(32).encode()
            consumer = Consumer(self.cfg, self.job_config, metrics=self.metrics, resume=self._resume, rank=0,
                                credential=secret)
            consumer.start()
            if store is not None:
                store.publish(self._meeting_key, Meeting(consumer.control_endpoint, (secret or b"").decode(),
                                                         keyed).encode())
            return consumer
        cfg, credential = self.cfg, None
        if store is not None:
            meeting = self._meet(store)
            meeting.check(self.rank, keyed)
            cfg = replace(cfg, dispatcher=meeting.control, attach_timeout_s=min(cfg.attach_timeout_s, REACH_S))
            credential = meeting.secret.encode() or None
        else:
            cfg = rank_zero_dispatcher(cfg, self.rank, self._master_addr)
        try:
            consumer = Consumer(cfg, None, metrics=self.metrics, resume=self._resume, rank=self.rank,
                                world_size=self.world_size, credential=credential)
        except ConnectionError as exc:
            if store is None:
                raise
            raise ConnectionError(f"rank {self.rank}: rank 0's dispatcher is up at {cfg.dispatcher} (it said so "
                                  f"through the job's store) but this node gets no answer from it in {REACH_S:.0f} "
                                  f"s: that address must be one this node reaches (rank 0's node sets it with "
                                  f"${HOST_ENV}), and the port must be open between the nodes ({exc})") from None
        consumer.start()
        return consumer

    def _meet(self, store: Rendezvous) -> Meeting:
        try:
            return Meeting.decode(store.fetch(self._meeting_key, self.cfg.attach_timeout_s))
        except RendezvousTimeout:
            raise ConnectionError(f"rank {self.rank}: rank 0 did not say where its dispatcher is within "
                                  f"{self.cfg.attach_timeout_s:.0f} s (through the job's store, key "
                                  f"{self._meeting_key}): every rank must make the same loaders in the same order, "
                                  f"and rank 0 must start its loader too") from None

    @property
    def metrics_port(self) -> int | None:
        """Where this rank serves /metrics (the port picked when the config asked for 0), or None."""
        return self.consumer.metrics_port

    @property
    def job(self) -> JobConfig:
        return self.consumer.job

    @property
    def epoch(self) -> int:
        """The epoch the next pass runs."""
        return self.consumer.position[0]

    @property
    def epochs(self) -> int:
        return self.consumer.job.epochs

    def __len__(self) -> int:
        """This rank's steps in the current epoch, the same on every rank. Images: exact, from the
        plan. Text (rows depend on the examples): exact once the epoch's streams are all in,
        before that the previous epoch's, or at first the number of documents over the batch size."""
        consumer = self.consumer
        epoch = min(consumer.position[0], consumer.job.epochs - 1)
        if consumer.job.kind.one_row_per_sample:
            return consumer.steps_of(epoch, 0)
        if epoch in self._epoch_steps:
            return self._epoch_steps[epoch]
        if epoch - 1 in self._epoch_steps:
            return self._epoch_steps[epoch - 1]
        return -(-consumer.plan.rank_sizes[self.rank] // consumer.job.batch_size)

    # ---- iteration ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """The next epoch's batches; nothing once every epoch is done."""
        consumer = self.consumer
        if self._schedule is None:
            self._schedule = consumer.schedule()
            self._converter = _Converter(consumer, self.device, self.format, self.prepare)
            if self.overlap:
                self._ahead = queue.Queue(maxsize=1)
                self._prefetch = threading.Thread(target=self._fill, name="stoker-prefetch", daemon=True)
                self._prefetch.start()
        if consumer.position[0] >= consumer.job.epochs:
            return
        while True:
            self._hand_back()  # asking for the next batch means the step of the last one is over
            item = self._take()
            if item is None:
                return
            if isinstance(item, EpochDone):
                self._epoch_steps[item.epoch] = item.steps
                consumer.epoch_done(item)
                return
            scheduled, batch = item
            self._pending = scheduled
            consumer.taken(scheduled)
            if batch.ready is not None:
                _wait_for_copy(batch)
            yield batch

    def _take(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        if self._ahead is None:
            return self._produce()
        item, error = self._ahead.get()
        if error is not None:
            raise error
        return item

    def _produce(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        item = self._schedule.next()
        if isinstance(item, Scheduled):
            return item, self._converter.convert(item)
        return item if isinstance(item, EpochDone) else None

    def _fill(self) -> None:
        """The prefetch thread: batch N+1 is converted (and copied to the device) during step N."""
        while True:
            try:
                item = self._produce()
            except BaseException as exc:  # surfaced by the training thread's next()
                self._ahead.put((None, exc))
                return
            self._ahead.put((item, None))
            if item is None:
                return

    def _hand_back(self) -> None:
        """The step of the batch yielded last is over: its credit and books go back."""
        if self._pending is not None:
            self.consumer.step_done(self._pending)
            self._pending = None

    @classmethod
    def over(cls, consumer: Consumer, **options: Any) -> Loader:
        """A loader over a consumer made already (the built-in training loop's way in)."""
        loader = cls(config=consumer.cfg, rank=consumer.rank, world_size=consumer.job.world_size, **options)
        loader._consumer = consumer
        return loader

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The job's data position after every batch yielded so far (torch's convention)."""
        return self.consumer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (another job's is refused with the reason); before the first pass."""
        if self._consumer is not None:
            raise RuntimeError("load_state_dict() goes before the loader is first used")
        self._resume = state

    # ---- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close sockets and threads (rank 0 first waits a while for the other ranks to finish)."""
        if self._consumer is not None:
            self._hand_back()
            self._consumer.stop()
        self._closed = True

    def __enter__(self) -> Loader:
        self.consumer  # noqa: B018 - bind and attach now, so that errors come from the `with`
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Converter:
    """From a received batch to what the step wants: the `prepare` hook's result, or arrays in the
    requested format on the device (JPEGs decoded first when they travel encoded)."""

    def __init__(self, consumer: Consumer, device: str, format: str, prepare) -> None:
        self.consumer = consumer
        self.device = device
        self.format = format
        self.prepare = prepare
        self.decoder = None
        if consumer.job.decode_on == "accelerator" and prepare is None:
            from accel.jpeg_decode import DaliJpegDecoder, DecodingAccelerator

            self.decoder = DecodingAccelerator(None, DaliJpegDecoder(consumer.job.image_size, consumer.job.batch_size,
                                                                     device, consumer.cfg.decode_threads),
                                               key_of=consumer.manifest.key_of)
        self._stream = None

    def convert(self, step: Scheduled) -> Batch:
        started = time.perf_counter()
        received = step.batch
        if self.prepare is not None:
            prepared = self.prepare(received) if received.size else None
            return Batch({}, received.size, step.epoch, step.step, received.sample_ids, received, prepared,
                         time.perf_counter() - started)
        if self.decoder is not None and received.size:
            decoded = self.decoder.decode(received)
            arrays = {"image": decoded.images, "label": decoded.labels}
            ids, rows = decoded.sample_ids, decoded.size
        else:
            arrays = {name: received.tensor(name) for name in received.tensors.parts}
            ids, rows = received.sample_ids, received.size
        tensors, ready = self._to_format(arrays)
        return Batch(tensors, rows, step.epoch, step.step, ids, received, None, time.perf_counter() - started, ready)

    def _to_format(self, arrays: dict[str, Any]) -> tuple[dict[str, Any], object]:
        if self.format == "numpy":
            return {k: v if isinstance(v, np.ndarray) else v.cpu().numpy() for k, v in arrays.items()}, None
        if self.format == "jax":
            import jax

            return {k: jax.device_put(np.asarray(v)) for k, v in arrays.items()}, None
        import torch

        device = torch.device(self.device)
        if device.type != "cuda":
            return {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for k, v in arrays.items()}, None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        out = {}
        with torch.cuda.stream(self._stream):
            for k, v in arrays.items():
                tensor = v if isinstance(v, torch.Tensor) else torch.from_numpy(v).pin_memory()
                out[k] = tensor.to(device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return out, ready


def _wait_for_copy(batch: Batch) -> None:
    """On the training thread: its stream waits for the side stream's copy (the host does not), and
    the tensors are marked as used there so the allocator does not hand their memory out early."""
    import torch

    stream = torch.cuda.current_stream()
    stream.wait_event(batch.ready)
    for tensor in batch.tensors.values():
        tensor.record_stream(stream)
