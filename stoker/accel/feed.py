"""A rank's steps as batches: what `for batch in loader:` runs, and the built-in training loop too.

The rank's scheduled steps (accel.steps) are one stream, each converted to the requested
format on the device (or handed to a `prepare` hook), batch N+1 on a prefetch thread while
step N runs (`overlap`). Asking for the next batch means the step of the last one is over:
its books close and its credit goes back (`StepSource.step_done`).

`iter()` restarts nothing: every iterator (`FeedPass`) draws from that one stream and stops at
the end of the epoch of its first batch, so no framework's iteration habit loses or repeats a
batch. A pass that took an epoch's last batch without asking once more (a trainer that takes
`len(loader)` batches) leaves the epoch's end unseen: the next pass passes over it and begins
the next epoch. A pass left mid-epoch is continued by the next one. An older iterator asked
again after a newer one finished its epoch is over: it stops, having lost nothing.

With `commit_steps` a step counts only once the trainer commits it (`commit()`: a fault-tolerant
trainer whose step may be rolled back, torchft's `should_commit()`): the position moves and the
batch's books close (its unit is acked) at the commit, and a batch asked past without a commit
is given again, the same batch, until it is committed. Nothing uncommitted is ever acked, so a
rank that dies resumes from its last commit and steps the rest once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from stoker.accel.batch import ReceivedBatch
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.schema import BatchSchema, schema_of
from stoker.accel.steps import EpochDone, Scheduled, StepSchedule
from stoker.pipeline.images import layout as image_layout
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.protos.errors import ConfigError, StateError

FORMATS = ("torch", "numpy", "jax")
NOT_COMMITTING = ("commit() needs a loader made with commit_steps=True (then every step must be committed, or its "
                  "batch comes again)")
NOTHING_TO_COMMIT = ("commit(): no batch is in hand to commit (each batch is committed once, after it was given and "
                     "before the next is asked for)")
WAKE_S = 0.5  # a main thread waiting for the next batch wakes this often (to see a Ctrl-C)


class StepSource(Protocol):
    """A rank as a feed sees it (accel.consumer.Consumer): its job and its ordered stream of steps."""

    cfg: ConsumerConfig
    job: JobConfig
    manifest: Manifest

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, steps taken in it): where the data stands."""
        ...

    def schedule(self) -> StepSchedule: ...

    def taken(self, step: Scheduled) -> None: ...

    def step_done(self, step: Scheduled) -> None: ...

    def epoch_done(self, end: EpochDone) -> None: ...


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
    ready: Any = field(default=None, repr=False)  # CUDA: the event the copy stream recorded

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


class UncommittedStep(StateError):
    """commit() with no batch to commit, or naming another batch than the one in hand."""


class Feed:
    def __init__(self, source: StepSource, device: str = "cpu", format: str = "torch", overlap: bool = True,
                 prepare: Callable[[ReceivedBatch], object] | None = None, commit_steps: bool = False) -> None:
        """`prepare`: run on the prefetch thread on each received batch instead of the format
        conversion; its result is `batch.prepared`. `commit_steps`: a step counts when `commit()` is
        called, and a batch not committed is given again (the module's docstring)."""
        if format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
        self.source = source
        self.overlap = overlap
        self.commit_steps = commit_steps
        self._uncommitted: tuple[Scheduled, Batch] | None = None  # commit_steps: given, not yet committed
        self.epoch_steps: dict[int, int] = {}  # epoch -> its steps on every rank, once its end was seen
        self._schedule = source.schedule()
        self._converter = _Converter(source, device, format, prepare)
        self._ahead: queue.Queue[tuple[object, BaseException | None]] | None = None
        if overlap:
            self._ahead = queue.Queue(maxsize=1)
            threading.Thread(target=self._fill, name="stoker-prefetch", daemon=True).start()
        self._pending: Scheduled | None = None  # yielded and not yet handed back
        self._peeked: tuple[Scheduled, Batch] | EpochDone | None = None  # taken from the stream, not yet given
        self.in_hand: int | None = None  # the epoch of the last batch given, until that epoch's end is seen
        self._ended = False  # the stream gave its end
        self._failed: BaseException | None = None  # the error the stream ended with
        self._closed: BaseException | None = None  # what every iterator raises once its loader is closed

    def __iter__(self) -> FeedPass:
        """A pass: the batches left of the epoch in hand, or the next epoch's; nothing once every epoch is done."""
        return FeedPass(self)

    @property
    def ended(self) -> bool:
        """The stream gave its end (every epoch done, or the job stopped early): no pass gives a batch again."""
        return self._ended

    @property
    def epoch(self) -> int:
        """The epoch of the batch in hand, until its end is seen; else the epoch the next batch comes from."""
        return self.in_hand if self.in_hand is not None else self.source.position[0]

    def next_of(self, feed_pass: FeedPass) -> Batch | None:
        """The pass's next batch, or None at its epoch's end (a later epoch's item stays for the next pass)."""
        if self._closed is not None:
            raise self._closed
        if self._uncommitted is not None:  # commit_steps: the step was not committed, so it is given again
            scheduled, batch = self._uncommitted
            if feed_pass.epoch is None or feed_pass.epoch == scheduled.epoch:
                feed_pass.epoch = scheduled.epoch
                return batch
            return None
        self.hand_back()  # asking for the next batch means the step of the last one is over
        if feed_pass.epoch is None:
            item = self._first_of_pass()
            if item is None:
                return None
            feed_pass.epoch = item.epoch if isinstance(item, EpochDone) else item[0].epoch
        item = self._peek()
        if isinstance(item, EpochDone):
            if item.epoch == feed_pass.epoch:
                self._end_epoch(item)
            return None
        if item is None or item[0].epoch != feed_pass.epoch:
            return None
        self._peeked = None
        scheduled, batch = item
        self.in_hand = scheduled.epoch
        if batch.ready is not None:
            _wait_for_copy(batch)
        if self.commit_steps:
            self._uncommitted = item
        else:
            self._pending = scheduled
            self.source.taken(scheduled)
        return batch

    def commit(self, batch: Batch | None = None) -> None:
        """commit_steps: the step of the batch in hand is committed; its position and books count from now
        (`batch`, when given, must be that batch). UncommittedStep when there is none to commit."""
        if not self.commit_steps:
            raise ConfigError(NOT_COMMITTING)
        if self._uncommitted is None:
            raise UncommittedStep(NOTHING_TO_COMMIT)
        scheduled, in_hand = self._uncommitted
        if batch is not None and not isinstance(batch, Batch):
            raise UncommittedStep(f"commit(batch): give the Batch the loader gave (or nothing, for the one in hand), "
                                  f"not a {type(batch).__name__}")
        if batch is not None and batch is not in_hand:
            raise UncommittedStep(f"commit(batch): the batch in hand is epoch {scheduled.epoch} step "
                                  f"{scheduled.step}, not the one given (epoch {batch.epoch} step {batch.step})")
        self._uncommitted = None
        self.source.taken(scheduled)
        self.source.step_done(scheduled)

    @property
    def uncommitted(self) -> Batch | None:
        """commit_steps: the batch given and not yet committed (it comes again), or None."""
        return self._uncommitted[1] if self._uncommitted is not None else None

    def _first_of_pass(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        """Where a new pass begins: past the end of an epoch whose batches an earlier pass took (all of them,
        without asking once more), or None once every epoch is done (the stream is not waited on then)."""
        if self.in_hand is None and self.source.position[0] >= self.source.job.epochs:
            return None
        item = self._peek()
        if isinstance(item, EpochDone) and item.epoch == self.in_hand:
            self._end_epoch(item)
            if self.source.position[0] >= self.source.job.epochs:
                return None
            item = self._peek()
        return item

    def _peek(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        """The stream's next item, kept until given; None once the stream ended (then not waited on again),
        and the error it ended with raised again to whoever asks after it."""
        if self._failed is not None:
            raise self._failed
        if self._peeked is None and not self._ended:
            try:
                self._peeked = self._take()
            except Exception as exc:  # not a Ctrl-C: that interrupts the wait, not the stream
                self._failed = exc
                raise
            self._ended = self._peeked is None
        return self._peeked

    def _end_epoch(self, end: EpochDone) -> None:
        self._peeked, self.in_hand = None, None
        self.epoch_steps[end.epoch] = end.steps
        self.source.epoch_done(end)

    def close(self, error: BaseException) -> None:
        """Its loader is closed: every iterator, old ones included, raises `error` from now on (a batch in hand
        or prefetched is not given after close)."""
        self._closed = error

    def hand_back(self) -> None:
        """The step of the batch yielded last is over: its credit and books go back (an uncommitted one's
        do not: it was never stepped, as far as the job's position goes)."""
        if self._pending is not None:
            self.source.step_done(self._pending)
            self._pending = None

    def _take(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        if self._ahead is None:
            return self._produce()
        while True:
            try:
                item, error = self._ahead.get(timeout=WAKE_S)
                break
            except queue.Empty:  # wake now and then: Ctrl-C may land on another thread, and only a
                continue  # main thread that wakes raises KeyboardInterrupt for it
        if error is not None:
            raise error
        return item  # type: ignore[return-value]  # what _produce made

    def _produce(self) -> tuple[Scheduled, Batch] | EpochDone | None:
        item = self._schedule.next()
        if isinstance(item, Scheduled):
            return item, self._converter.convert(item)
        return item if isinstance(item, EpochDone) else None

    def _fill(self) -> None:
        """The prefetch thread: batch N+1 is converted (and copied to the device) during step N."""
        assert self._ahead is not None
        while True:
            try:
                item = self._produce()
            except BaseException as exc:  # surfaced by the training thread's next()
                self._ahead.put((None, exc))
                return
            self._ahead.put((item, None))
            if item is None:
                return


class FeedPass(Iterator[Batch]):
    """One `iter()` of a feed: the batches of one epoch, from where the stream stands (accel.feed's docstring)."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.epoch: int | None = None  # set by the first batch (or epoch end) the pass meets
        self.over = False

    def __iter__(self) -> FeedPass:
        return self

    def __next__(self) -> Batch:
        batch = None if self.over else self.feed.next_of(self)
        if batch is None:
            self.over = True
            raise StopIteration
        return batch


class _Converter:
    """From a received batch to what the step wants: the `prepare` hook's result, or arrays in the
    requested format on the device (JPEGs decoded first when they travel encoded)."""

    def __init__(self, source: StepSource, device: str, format: str,
                 prepare: Callable[[ReceivedBatch], object] | None) -> None:
        self.device = device
        self.format = format
        self.prepare = prepare
        self.decoder: Any = None
        job = source.job
        if job.decode_on == DecodeOn.ACCELERATOR and prepare is None:
            from stoker.accel.jpeg_decode import DaliJpegDecoder, DecodingAccelerator

            # no inner step: the feed calls decode() alone and the script steps (DecodingAccelerator's inner
            # is a Step for the training loop's use, which this is not)
            dali = DaliJpegDecoder(job.image_size, job.batch_size, device, source.cfg.decode_threads,
                                   job.corrupt_jpegs)
            self.decoder = DecodingAccelerator(None, dali, key_of=source.manifest.key_of)  # type: ignore[arg-type]
        self._stream: Any = None
        self._job = job
        self._schema: BatchSchema | None = None  # what a step gives, made at the first empty batch

    def convert(self, step: Scheduled) -> Batch:
        started = time.perf_counter()
        received = step.batch
        if self.prepare is not None:
            prepared = self.prepare(received) if received.size else None
            return Batch({}, received.size, step.epoch, step.step, received.sample_ids, received, prepared,
                         time.perf_counter() - started)
        if not received.size:  # an empty batch (a unit's unfilled batch, a split's empty piece): the job's
            arrays = self._empty()  # tensors, zero rows, whatever the wire carried
            ids, rows = received.sample_ids, 0
        elif self.decoder is not None:
            decoded = self.decoder.decode(received)
            arrays = {"image": decoded.images, "label": decoded.labels}
            ids, rows = decoded.sample_ids, decoded.size
        else:
            arrays = {name: received.tensor(name) for name in received.tensors.parts}
            ids, rows = received.sample_ids, received.size
        tensors, ready = self._to_format(arrays)
        return Batch(tensors, rows, step.epoch, step.step, ids, received, None, time.perf_counter() - started, ready)

    def _empty(self) -> dict[str, Any]:
        """The job's tensors with no rows: the wire's, or decoded images where the accelerator decodes."""
        if self._schema is None:
            job = self._job
            self._schema = (BatchSchema(image_layout.tensor_specs(job.image_size), True) if self.decoder is not None
                            else schema_of(job))
        return self._schema.empty()

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
