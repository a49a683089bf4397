"""Whole batches from one work unit: prepare each sample, skip the ones that cannot be used.

What "prepare" means is the job's decode placement (`SampleWork`): on the host it decodes
and augments to pixels (`DecodeOnHost`); with decoding on the accelerator it only reads the
JPEG header, draws the same random crop and flip, and ships the encoded bytes
(`ShipEncoded`). A unit's rows are cut into batches by position, so a unit always gives the
same number of batches: a skipped sample leaves its batch a row short rather than pulling in
the next one, and every rank's step count follows from the plan.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.augment import Crop, DecodeError, Transform, decode_augment, jpeg_size
from pipeline.plan import Unit, batch_bounds
from pipeline.seeds import sample_random
from pipeline.shards import ShardReader


@dataclass
class Prepared:
    """One sample as a worker ships it, and the seconds its two stages took."""

    payload: object
    decode_s: float
    augment_s: float
    decode_path: str = ""  # pipeline.augment.DECODE_PATHS; "" where nothing was decoded


class SampleWork(Protocol):
    def prepare(self, jpeg: bytes | memoryview, rng: random.Random, restarts: memoryview | None = None) -> Prepared:
        """Raises DecodeError for a sample that cannot be used. `restarts`: the JPEG's restart
        index, for a decoder that can use it."""

    def tensors(self, payloads: list) -> dict[str, np.ndarray]:
        """The batch's tensors (without the labels) from its samples' payloads."""


@dataclass(frozen=True)
class DecodeOnHost:
    transform: Transform
    decoder: str = "auto"

    def prepare(self, jpeg: bytes | memoryview, rng: random.Random, restarts: memoryview | None = None) -> Prepared:
        decoded = decode_augment(jpeg, self.transform, rng, self.decoder, restarts)
        return Prepared(decoded.pixels, decoded.decode_s, decoded.augment_s, decoded.path)

    def tensors(self, payloads: list) -> dict[str, np.ndarray]:
        size = self.transform.size
        images = np.empty((len(payloads), size, size, 3), dtype=np.uint8)
        for i, pixels in enumerate(payloads):
            images[i] = pixels
        return {"image": images}


@dataclass(frozen=True)
class ShipEncoded:
    """Decode on the accelerator: the JPEG bytes travel with the crop box and flip drawn here,
    from the same per-sample generator as on the host, so both placements see the same crops.

    Tensors: `jpeg` (all bytes, concatenated), `jpeg_end` (int64, where each row's bytes end),
    `crop` (float32 left, top, width, height in stored pixels) and `flip` (uint8)."""

    transform: Transform

    def prepare(self, jpeg: bytes | memoryview, rng: random.Random, restarts: memoryview | None = None) -> Prepared:
        """The transcoded JPEG is a plain baseline one to DALI; its index stays here."""
        started = time.perf_counter()
        width, height = jpeg_size(jpeg)  # raises DecodeError for a broken header
        crop = pixel_window(self.transform.crop(width, height, rng), width, height)
        return Prepared((jpeg, crop), 0.0, time.perf_counter() - started)

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


def sample_work(transform: Transform, decoder: str = "auto", decode_on: str = "host") -> SampleWork:
    if decode_on == "accelerator":
        return ShipEncoded(transform)
    if decode_on != "host":
        raise ValueError(f"decode_on must be host or accelerator, not {decode_on!r}")
    return DecodeOnHost(transform, decoder)


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
    decode_paths: list[str] = field(default_factory=list)  # per sample, pipeline.augment.DECODE_PATHS

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


def unit_batches(reader_of: Callable[[int], ShardReader | str], unit: Unit, work: SampleWork, batch_size: int,
                 seed: int) -> Iterator[ImageBatch]:
    """Every batch of `unit`: its rows in their seeded order, cut every `batch_size` rows (they may
    come from several shards: `reader_of(shard index)` gives a reader, or why the shard is
    unusable). An unusable image leaves its batch a row short, so a unit always gives
    ceil(size / batch_size) batches (at least one, possibly empty, marked last), cut as
    `pipeline.plan.batch_bounds` says."""
    rows = unit.rows(seed)
    bounds = batch_bounds(len(rows), batch_size)
    for index, (start, stop) in enumerate(bounds):
        samples: list[_Sample] = []
        skipped: list[tuple[int, str, str]] = []
        for shard, row, sample_id in rows[start:stop]:
            reader = reader_of(shard)
            if isinstance(reader, str):
                skipped.append((sample_id, f"shard {shard} row {row}", reader))
                continue
            try:
                prepared = work.prepare(reader.jpeg(row), sample_random(seed, unit.epoch, sample_id),
                                        reader.restarts(row))
            except DecodeError as exc:
                skipped.append((sample_id, reader.key(row), str(exc)))
                continue
            samples.append(_Sample(sample_id, reader.label(row), prepared))
        yield _assemble(work, samples, skipped, index, last=index == len(bounds) - 1)


def _assemble(work: SampleWork, samples: list[_Sample], skipped: list[tuple[int, str, str]], index: int,
              last: bool) -> ImageBatch:
    return ImageBatch(
        tensors=work.tensors([s.prepared.payload for s in samples]) if samples else {},
        labels=np.array([s.label for s in samples], dtype=np.int32),
        sample_ids=[s.sample_id for s in samples],
        skipped=skipped,
        batch_index=index,
        last=last,
        decode_times=[s.prepared.decode_s for s in samples],
        augment_times=[s.prepared.augment_s for s in samples],
        decode_paths=[s.prepared.decode_path for s in samples if s.prepared.decode_path],
    )
