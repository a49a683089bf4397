"""Shards made to measure, and damaged on purpose, for the tests of what a worker does with bad shards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from stoker.pipeline.images.batching import HostTransform
from stoker.pipeline.job import JobConfig
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import IMAGE_SCHEMA, Manifest, ShardInfo, ShardReader, file_sha256
from stoker.pipeline.transforms import Sample
from stoker.workers.sources import transform_of

Row = tuple[str, int, bytes, bytes | None]  # key, label, jpeg, restarts
ROWS = 16  # rows per shard of the `sixteen` fixture
JOB = dict(batch_size=8, unit_batches=2, image_size=32)  # a unit is 16 rows: with `sixteen`, one shard each


def rows_of(manifest: Manifest) -> list[Row]:
    rows = []
    for index in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            restarts = reader.restarts(row)
            rows.append((reader.key(row), reader.label(row), bytes(reader.jpeg(row)),
                         bytes(restarts) if restarts is not None else None))
    return rows


def write_shard(path: Path, rows: list[Row], first_sample_id: int = 0, schema: pa.Schema = IMAGE_SCHEMA) -> ShardInfo:
    columns = zip(zip(*rows, strict=True), IMAGE_SCHEMA, schema, strict=True)
    arrays = [pa.array(values, written.type).cast(wanted.type) for values, written, wanted in columns]
    with pa.ipc.new_file(str(path), schema) as writer:
        writer.write_batch(pa.record_batch(arrays, schema=schema))
    return ShardInfo(path.name, len(rows), path.stat().st_size, file_sha256(path), first_sample_id)


def reshard(manifest: Manifest, dst: Path, rows_per_shard: int,
            edit: Callable[[int, list[Row]], list[Row]] | None = None) -> Manifest:
    """The manifest's samples in shards of exactly `rows_per_shard` rows (the last may hold fewer),
    so that units of that many rows each read one shard; `edit(shard, rows)` may change a shard's
    rows before it is written (the manifest then describes what was written)."""
    dst.mkdir(parents=True, exist_ok=True)
    rows = rows_of(manifest)
    infos = []
    for index, start in enumerate(range(0, len(rows), rows_per_shard)):
        part = rows[start: start + rows_per_shard]
        part = edit(index, part) if edit else part
        infos.append(write_shard(dst / f"train-{index:05d}.arrow", part, start))
    made = Manifest(kind=manifest.kind, classes=manifest.classes, shards=infos)
    made.save(dst / "manifest.json")
    made.uri = str(dst / "manifest.json")  # as loaded; not loaded: an edit may leave a gap a test then closes
    return made


def flip_inside_a_jpeg(path: Path, jpeg: bytes) -> None:
    """Invert 16 bytes in the middle of `jpeg`'s entropy-coded data where the shard file holds it."""
    data = bytearray(path.read_bytes())
    at = data.index(jpeg) + len(jpeg) // 2
    data[at: at + 16] = bytes(b ^ 0xFF for b in data[at: at + 16])
    path.write_bytes(bytes(data))


def expected_images(manifest: Manifest, job: JobConfig, epoch: int = 0) -> dict[int, tuple[np.ndarray, int]]:
    """Every sample as a worker makes it for `job` from these (valid) shards: sample id -> (image, label)."""
    work = HostTransform(transform_of(job), job.decoder)
    images = {}
    for index, info in enumerate(manifest.shards):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            sample_id = info.first_sample_id + row
            sample = Sample(sample_id, reader.key(row), reader.label(row), reader.jpeg(row))
            image = work.prepare(sample, sample_random(job.seed, epoch, sample_id), reader.restarts(row))
            images[sample_id] = (image.payload["image"], reader.label(row))
    return images
