"""The loader a training script pulls from: `for batch in loader:`, one epoch per pass.

Each rank of a data-parallel job makes one Loader (rank and world size from its arguments or
from torchrun's RANK / WORLD_SIZE / LOCAL_RANK). Rank 0 runs the job's dispatcher in its
process unless `config.dispatcher` names one elsewhere; the other ranks attach to it. Every
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

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from accel.batch import ReceivedBatch
from accel.consumer import Consumer
from accel.consumer_config import ConsumerConfig, rank_metrics_port
from accel.metrics import ConsumerMetrics
from accel.steps import EpochDone, Scheduled
from protos.job import JobConfig

FORMATS = ("torch", "numpy", "jax")


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


def ranks_from_env(rank: int | None, world_size: int | None, local_rank: int | None) -> tuple[int, int, int]:
    """Arguments first, then torchrun's environment, then a single rank."""
    def pick(given: int | None, name: str, default: int) -> int:
        if given is not None:
            return given
        text = os.environ.get(name, "")
        try:
            return int(text) if text else default
        except ValueError:
            raise ValueError(f"${name}={text!r} is not a number") from None

    world = pick(world_size, "WORLD_SIZE", 1)
    rank_ = pick(rank, "RANK", 0)
    local = pick(local_rank, "LOCAL_RANK", rank_)
    if world < 1 or not 0 <= rank_ < world:
        raise ValueError(f"rank {rank_} is not one of world size {world}'s ranks 0..{world - 1}")
    return rank_, world, local


def with_rank_zero_dispatcher(cfg: ConsumerConfig, rank: int) -> ConsumerConfig:
    """A rank other than 0 with no dispatcher named attaches to rank 0's: its control port at $MASTER_ADDR."""
    if not rank or cfg.dispatcher:
        return cfg
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    return replace(cfg, dispatcher=f"tcp://{host}:{cfg.control_bind.rsplit(':', 1)[1]}")


class Loader:
    def __init__(self, job: JobConfig | None = None, *, config: ConsumerConfig | None = None,
                 rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
                 device: str = "cpu", format: str = "torch", overlap: bool = True,
                 prepare: Callable[[ReceivedBatch], object] | None = None,
                 metrics: ConsumerMetrics | None = None) -> None:
        """`job`: rank 0's (it runs the dispatcher); other ranks leave it None and get the job from
        the dispatcher. `config`: sockets, keys, credit (default: the data socket on a free port,
        /metrics on 9560 for local rank 0 and 9570 + local rank for the others, the dispatcher on
        rank 0's control port at $MASTER_ADDR).
        `prepare`: run on the prefetch thread on each received batch instead of the format
        conversion (the built-in training steps use it); its result is `batch.prepared`."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
        self.rank, self.world_size, self.local_rank = ranks_from_env(rank, world_size, local_rank)
        cfg = config or ConsumerConfig(data_bind="tcp://127.0.0.1:0", metrics_port=rank_metrics_port(self.local_rank))
        cfg = with_rank_zero_dispatcher(cfg, self.rank)
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
            job = self.job_config if not self.cfg.dispatcher else None
            self._consumer = Consumer(self.cfg, job, metrics=self.metrics, resume=self._resume, rank=self.rank,
                                      world_size=self.world_size if self.cfg.dispatcher else None)
            self._consumer.start()
        return self._consumer

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
