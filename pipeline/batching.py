"""Whole batches from one work unit: decode + augment each sample, skip undecodable ones.

A batch stays full-size when a sample is skipped (the next sample takes its place), so only
a unit's last batch can be short. The generator looks one sample ahead, so it knows which
batch is the last of the unit when it yields it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from pipeline.augment import DecodedSample, DecodeError, Transform, decode_augment
from pipeline.plan import Unit
from pipeline.seeds import sample_random
from pipeline.shards import ShardReader


@dataclass
class ImageBatch:
    images: np.ndarray  # uint8 (n, size, size, 3)
    labels: np.ndarray  # int32 (n,)
    sample_ids: list[int]
    skipped: list[tuple[int, str, str]]  # (sample id, key, reason) of undecodable samples
    batch_index: int
    last: bool
    decode_times: list[float] = field(default_factory=list)  # seconds, per sample
    augment_times: list[float] = field(default_factory=list)

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
    decoded: DecodedSample
    skipped_before: list[tuple[int, str, str]] = field(default_factory=list)


def _samples(reader: ShardReader, unit: Unit, transform: Transform, seed: int,
             decoder: str) -> Iterator[_Sample | list[tuple[int, str, str]]]:
    """Decoded samples in unit order; a trailing list holds skips after the last good one."""
    skipped: list[tuple[int, str, str]] = []
    for row in unit.sample_order(seed):
        row = int(row)
        sample_id = unit.first_sample_id + row
        rng = sample_random(seed, unit.epoch, sample_id)
        try:
            decoded = decode_augment(reader.jpeg(row), transform, rng, decoder)
        except DecodeError as exc:
            skipped.append((sample_id, reader.key(row), str(exc)))
            continue
        yield _Sample(sample_id, reader.label(row), decoded, skipped)
        skipped = []
    yield skipped


def unit_batches(reader: ShardReader, unit: Unit, transform: Transform, batch_size: int,
                 seed: int, decoder: str = "auto") -> Iterator[ImageBatch]:
    """Every batch of `unit`; always at least one (possibly empty) batch marked last."""
    stream = _samples(reader, unit, transform, seed, decoder)
    pending: list[_Sample] = []
    index = 0
    for item in stream:
        if isinstance(item, list):  # end of unit
            yield _assemble(pending, item, index, transform.size, last=True)
            return
        if len(pending) == batch_size:
            yield _assemble(pending, [], index, transform.size, last=False)
            pending, index = [], index + 1
        pending.append(item)


def _assemble(samples: list[_Sample], trailing_skips: list[tuple[int, str, str]], index: int,
              size: int, last: bool) -> ImageBatch:
    images = np.empty((len(samples), size, size, 3), dtype=np.uint8)
    for i, sample in enumerate(samples):
        images[i] = sample.decoded.pixels
    skipped = [s for sample in samples for s in sample.skipped_before] + trailing_skips
    return ImageBatch(
        images=images,
        labels=np.array([s.label for s in samples], dtype=np.int32),
        sample_ids=[s.sample_id for s in samples],
        skipped=skipped,
        batch_index=index,
        last=last,
        decode_times=[s.decoded.decode_s for s in samples],
        augment_times=[s.decoded.augment_s for s in samples],
    )
