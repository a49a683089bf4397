"""Whole batches from one work unit: prepare each sample, skip the ones that cannot be used.

What "prepare" means is the job's decode placement (`SampleWork`): on the host it runs the
job's transform (`HostTransform`, pipeline.transforms); with decoding on the accelerator it only reads the
JPEG header, draws the same random crop and flip, and ships the encoded bytes
(`ShipEncoded`). A unit's rows are cut into batches by position, so a unit always gives the
same number of batches: a skipped sample leaves its batch a row short rather than pulling in
the next one, and every rank's step count follows from the plan.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from stoker.pipeline import activity
from stoker.pipeline.activity import Phase
from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.deadline import CallLimit, TransformTimeout
from stoker.pipeline.images.augment import DecodeError, Transform, decode_augment, decode_whole, jpeg_size
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from stoker.pipeline.transforms import Crop, ImageTransform, Sample, check_outputs
from stoker.pipeline.units import Unit, batch_bounds
from stoker.protos.errors import ConfigError


@dataclass
class Prepared:
    """One sample as a worker ships it, and the seconds its two stages took."""

    payload: object
    decode_s: float
    augment_s: float
    decode_path: str = ""  # pipeline.images.augment.DECODE_PATHS; "" where nothing was decoded


class SampleWork(Protocol):
    def prepare(self, sample: Sample, rng: random.Random, restarts: memoryview | None = None,
                rows: BatchRows | None = None) -> Prepared:
        """Raises DecodeError for a sample that cannot be used. `restarts`: the JPEG's restart
        index, for a decoder that can use it; `rows`: the batch being filled, for one that writes
        its output there itself."""

    def tensors(self, payloads: list) -> dict[str, np.ndarray]:
        """The batch's tensors (without the labels) from its samples' payloads."""


@dataclass(frozen=True)
class HostTransform:
    """The job's transform, run here (pipeline.transforms): decode as it asks (a crop window, the
    whole image, or nothing), call it, check what it returns against what it declared."""

    transform: ImageTransform
    decoder: str = "auto"
    name: str = "train"  # as the job names it, for errors
    timeout_s: float = 0.0  # > 0: a call running longer is interrupted and its sample skipped (main thread only)
    # the time limit of its calls; unit_batches sets its timer once per batch (`with work.limit:`)
    limit: CallLimit = field(init=False, repr=False, compare=False)
    declared: dict = field(init=False, repr=False, compare=False)  # its outputs, read once (a built-in's
    # `outputs` is a property that builds them on every read)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", CallLimit(self.timeout_s))
        object.__setattr__(self, "declared", dict(self.transform.outputs))

    def prepare(self, sample: Sample, rng: random.Random, restarts: memoryview | None = None,
                rows: BatchRows | None = None) -> Prepared:
        transform, takes = self.transform, self.transform.takes
        path, resize_s = "", 0.0
        if takes == "crop":  # the window's resize and mirror count as augmenting, as the transform's own work
            # a built-in's output is the crop itself: the decoder writes it into the batch row
            output = getattr(transform, "crop_output", None)
            into = None
            if rows is not None and isinstance(output, str) and output in self.declared:
                into = rows.lend(output)
            decoded = decode_augment(sample.data, transform, rng, self.decoder, restarts,  # type: ignore[arg-type]
                                     into)
            pixels, decode_s, resize_s, path = decoded.pixels, decoded.decode_s, decoded.augment_s, decoded.path
        elif takes == "pixels":
            pixels, decode_s = decode_whole(sample.data)
        else:
            pixels, decode_s = None, 0.0
        started, called = stage_clock(), time.monotonic()
        armed = self.limit.begin()
        try:
            out = transform(sample, rng, pixels)
        except TransformTimeout:
            raise TransformTimedOut(f"transform ran past --transform-timeout {self.timeout_s:g} s",
                                    time.monotonic() - called) from None
        except BaseException as exc:  # the user's code, sys.exit() and all: the sample is skipped and counted
            raise TransformFailed(f"transform raised {type(exc).__name__}: {_text(exc)}") from None
        finally:
            self.limit.end(armed)
        took = time.monotonic() - called
        if 0 < self.timeout_s < took:  # it caught its interruptions (a retry loop's bare except) and returned late
            raise TransformTimedOut(f"transform ran past --transform-timeout {self.timeout_s:g} s (it returned after "
                                    f"{took:.1f} s, having caught its interruption)", took)
        check_outputs(self.name, self.declared, out)
        return Prepared(out, decode_s, resize_s + stage_clock() - started, path)

    def tensors(self, payloads: list) -> dict[str, np.ndarray]:
        """Each declared output's rows, written into one array per output."""
        filling = self.batch_rows(len(payloads))
        for arrays in payloads:
            filling.put(arrays)
        return filling.take()

    def batch_rows(self, count: int) -> BatchRows:
        """A batch of `count` samples to fill as each one is made (unit_batches does)."""
        return BatchRows({name: np.empty((count, *out.shape), dtype=out.dtype)
                          for name, out in self.declared.items()})


@dataclass
class BatchRows:
    """One batch's arrays, one per declared output, each sample's outputs copied in as soon as it is
    made, while they are still in the cache: holding a batch's samples to copy them at the end read
    64 cold images back and cost about 3% of a core where worker processes share the cache
    (benchmarks/transform_contract.py)."""

    arrays: dict[str, np.ndarray]
    filled: int = 0
    lent: np.ndarray | None = None  # the next row of one output, given to a decoder to write into

    def lend(self, name: str) -> np.ndarray:
        """The next sample's row of output `name` to write into, so that `put` need not copy it: a crop
        written where it is sent saves a copy of each image (about 2% of a worker's CPU)."""
        self.lent = self.arrays[name][self.filled]
        return self.lent

    def put(self, outputs: Mapping[str, np.ndarray]) -> None:
        for name, array in outputs.items():
            if array is not self.lent:
                self.arrays[name][self.filled] = array
        self.lent = None
        self.filled += 1

    def take(self) -> dict[str, np.ndarray]:
        """The arrays, cut to the samples put (a skipped sample leaves its batch a row short)."""
        return {name: array if self.filled == len(array) else array[:self.filled]
                for name, array in self.arrays.items()}


def _text(exc: BaseException) -> str:
    """An exception's text, also when its __str__ raises."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - the user's __str__ may raise anything
        return "(its text cannot be made)"


class TransformFailed(DecodeError):
    """The transform raised on one sample: skipped and counted with the text, as an undecodable JPEG is."""


class TransformTimedOut(TransformFailed):
    """The transform ran past --transform-timeout on one sample: skipped, and reported (`OnHang`) so that
    the dispatcher skips it from then on."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


@dataclass(frozen=True)
class ShipEncoded:
    """Decode on the accelerator: the JPEG bytes travel with the crop box and flip drawn here,
    from the same per-sample generator as on the host, so both placements see the same crops.

    Tensors: `jpeg` (all bytes, concatenated), `jpeg_end` (int64, where each row's bytes end),
    `crop` (float32 left, top, width, height in stored pixels) and `flip` (uint8)."""

    transform: Transform

    def prepare(self, sample: Sample, rng: random.Random, restarts: memoryview | None = None,
                rows: BatchRows | None = None) -> Prepared:
        """The transcoded JPEG is a plain baseline one to DALI; its index stays here."""
        started = stage_clock()
        width, height = jpeg_size(sample.data)  # raises DecodeError for a broken header
        crop = pixel_window(self.transform.crop(width, height, rng), width, height)
        return Prepared((sample.data, crop), 0.0, stage_clock() - started)

    def tensors(self, payloads: list[tuple[bytes | memoryview, Crop]]) -> dict[str, np.ndarray]:
        ends = np.cumsum([len(jpeg) for jpeg, _ in payloads], dtype=np.int64)
        data = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
        start = 0
        for (jpeg, _), end in zip(payloads, ends, strict=True):
            data[start:end] = np.frombuffer(jpeg, dtype=np.uint8)
            start = int(end)
        crops = np.array([[c.left, c.top, c.width, c.height] for _, c in payloads], dtype=np.float32).reshape(-1, 4)
        flips = np.array([c.flip for _, c in payloads], dtype=np.uint8)
        return {"jpeg": data, "jpeg_end": ends, "crop": crops, "flip": flips}


def pixel_window(crop: Crop, width: int, height: int) -> Crop:
    """The crop as whole stored pixels inside the image, at least one each way: what a decoder
    that slices (DALI) can take. A training crop is already whole; an evaluation crop's
    fractional edges round to the nearest pixel, and a crop of a tiny image stays inside it.
    Dimensions are the header's: the EXIF orientation is ignored, as on the host."""
    left = min(max(round(crop.left), 0), width - 1)
    top = min(max(round(crop.top), 0), height - 1)
    right = min(max(round(crop.left + crop.width), left + 1), width)
    bottom = min(max(round(crop.top + crop.height), top + 1), height)
    return Crop(left, top, right - left, bottom - top, crop.flip)


def sample_work(transform: ImageTransform, decoder: str = "auto", decode_on: DecodeOn = DecodeOn.HOST,
                name: str = "train", timeout_s: float = 0.0) -> SampleWork:
    if decode_on == DecodeOn.ACCELERATOR:
        return ShipEncoded(transform)  # type: ignore[arg-type]  # JobConfig allows only the built-ins here
    if decode_on != DecodeOn.HOST:
        raise ConfigError(f"decode_on must be host or accelerator, not {decode_on!r}")
    return HostTransform(transform, decoder, name, timeout_s)


@dataclass
class ImageBatch:
    tensors: dict[str, np.ndarray]  # "image" (n, size, size, 3) uint8, or the encoded tensors
    labels: np.ndarray  # int32 (n,)
    sample_ids: list[int]
    skipped: list[tuple[int, str, str]]  # (sample id, key, reason) of unusable samples
    batch_index: int
    last: bool
    decode_times: list[float] = field(default_factory=list)  # seconds, per sample
    augment_times: list[float] = field(default_factory=list)
    decode_paths: list[str] = field(default_factory=list)  # per sample, pipeline.images.augment.DECODE_PATHS
    read_s: float = 0.0  # CPU seconds reading the samples (and opening or fetching their shards)
    read_wait_s: float = 0.0  # those reads' wall seconds beyond their CPU time: waiting for storage

    @property
    def images(self) -> np.ndarray:
        return self.tensors["image"]

    @property
    def decode_s(self) -> float:
        return sum(self.decode_times)

    @property
    def augment_s(self) -> float:
        return sum(self.augment_times)


@dataclass
class _Sample:
    sample_id: int
    label: int
    prepared: Prepared


OnHang = Callable[[int, int, float], None]  # (unit id, sample id, seconds): a transform call cut short at its limit


def unit_batches(reader_of: Callable[[int], ShardReader | str], unit: Unit, work: SampleWork, batch_size: int,
                 seed: int, skip: Mapping[int, str] | None = None, on_hang: OnHang | None = None
                 ) -> Iterator[ImageBatch]:
    """Every batch of `unit`: its rows in their seeded order, cut every `batch_size` rows (they may
    come from several shards: `reader_of(shard index)` gives a reader, or why the shard is
    unusable). An unusable image leaves its batch a row short, so a unit always gives
    ceil(size / batch_size) batches (at least one, possibly empty, marked last), cut as
    `pipeline.units.batch_bounds` says. A `work` with `batch_rows(count)` (HostTransform) has each sample
    copied into its batch as soon as it is made, and its payload let go. `skip`: sample id -> why it
    is not even read (it killed or hung the processes that transformed it), skipped like an unusable
    one; read at each sample, so a mapping that grows meanwhile is heeded. `on_hang`: told at once of
    each call cut short at the time limit, before the batch is sent."""
    rows = unit.rows(seed)
    bounds = batch_bounds(len(rows), batch_size)
    batch_rows: Callable[[int], BatchRows] | None = getattr(work, "batch_rows", None)
    limit: AbstractContextManager = getattr(work, "limit", None) or nullcontext()
    for index, (start, stop) in enumerate(bounds):
        samples: list[_Sample] = []
        skipped: list[tuple[int, str, str]] = []
        reads = ReadTimes()
        filling = batch_rows(stop - start) if batch_rows is not None else None
        with limit:  # the transform's time limit, set once for the batch, off again before it is sent
            _prepare_batch(reader_of, unit, work, seed, rows[start:stop], samples, skipped, filling,
                           {} if skip is None else skip, reads, on_hang)
        batch = _assemble(work, samples, skipped, index, index == len(bounds) - 1, filling)
        batch.read_s, batch.read_wait_s = reads.cpu_s, max(0.0, reads.wall_s - reads.cpu_s)
        yield batch


@dataclass
class ReadTimes:
    """A batch's reads, by both clocks: their CPU is a stage's cost, the wall time beyond it is storage."""

    cpu_s: float = 0.0
    wall_s: float = 0.0


def _prepare_batch(reader_of: Callable[[int], ShardReader | str], unit: Unit, work: SampleWork, seed: int,
                   rows: list[tuple[int, int, int]], samples: list[_Sample], skipped: list[tuple[int, str, str]],
                   filling: BatchRows | None, skip: Mapping[int, str], reads: ReadTimes,
                   on_hang: OnHang | None = None) -> None:
    """Each of a batch's rows made into `samples`, or into `skipped` with the reason. What the process
    does is noted (pipeline.activity) sample by sample, for its daemon."""
    for shard, row, sample_id in rows:
        if sample_id in skip:
            skipped.append((sample_id, f"shard {shard} row {row}", skip[sample_id]))
            continue
        activity.note(Phase.READING, unit.unit_id, sample_id)
        cpu_from, wall_from = stage_clock(), time.perf_counter()
        reader = reader_of(shard)
        if isinstance(reader, str):
            skipped.append((sample_id, f"shard {shard} row {row}", reader))
            continue
        sample = Sample(sample_id, reader.key(row), reader.label(row), reader.jpeg(row))
        reads.cpu_s += stage_clock() - cpu_from
        reads.wall_s += time.perf_counter() - wall_from
        activity.note(Phase.TRANSFORMING, unit.unit_id, sample_id)
        try:
            prepared = work.prepare(sample, sample_random(seed, unit.epoch, sample_id), reader.restarts(row), filling)
        except DecodeError as exc:
            if isinstance(exc, TransformTimedOut) and on_hang is not None:
                on_hang(unit.unit_id, sample_id, exc.seconds)
            skipped.append((sample_id, sample.key, str(exc)))
            continue
        if filling is not None:
            filling.put(prepared.payload)  # type: ignore[arg-type]
            prepared.payload = None
        samples.append(_Sample(sample_id, sample.label, prepared))


def _assemble(work: SampleWork, samples: list[_Sample], skipped: list[tuple[int, str, str]], index: int,
              last: bool, filled: BatchRows | None = None) -> ImageBatch:
    if not samples:
        tensors: dict[str, np.ndarray] = {}
    elif filled is not None:
        tensors = filled.take()
    else:
        tensors = work.tensors([s.prepared.payload for s in samples])
    return ImageBatch(
        tensors=tensors,
        labels=np.array([s.label for s in samples], dtype=np.int32),
        sample_ids=[s.sample_id for s in samples],
        skipped=skipped,
        batch_index=index,
        last=last,
        decode_times=[s.prepared.decode_s for s in samples],
        augment_times=[s.prepared.augment_s for s in samples],
        decode_paths=[s.prepared.decode_path for s in samples if s.prepared.decode_path],
    )
