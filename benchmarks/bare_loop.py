"""The bare loop: the worker's own decode + augment + batch code, no sockets, one process.

Prints one JSON line: images, CPU seconds, images per CPU-second (the first batch is warm-up,
not timed). `--images N` goes round the epochs until N images are timed (a small set, such as
benchmarks.foreign's, is shorter than one timing needs).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator

from stoker.pipeline.images.augment import TrainTransform
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardReader


def batches(manifest: Manifest, batch_size: int, unit_batches_each: int, seed: int, epochs: int) -> Iterator:
    """The worker's batches of `epochs` epochs, as a worker makes them (readers kept open)."""
    readers: dict[int, ShardReader] = {}

    def reader_of(shard: int) -> ShardReader:
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    work = HostTransform(TrainTransform())
    for epoch in range(epochs):
        for unit in EpochPlan(manifest, batch_size * unit_batches_each, epochs, seed).units(epoch):
            yield from unit_batches(reader_of, unit, work, batch_size, seed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--unit-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=0, help="images to time at least (default: one epoch)")
    args = parser.parse_args()
    manifest = Manifest.load(args.manifest)
    epochs = max(1, -(-(args.images + args.batch_size) // manifest.num_samples))
    images, started = 0, None
    for batch in batches(manifest, args.batch_size, args.unit_batches, args.seed, epochs):
        if started is None:
            started = time.process_time()  # after the first batch: warm-up
            continue
        images += len(batch.sample_ids)
        if args.images and images >= args.images:
            break
    seconds = time.process_time() - started
    print(json.dumps({"images": images, "seconds": seconds, "images_per_s": images / seconds}))


if __name__ == "__main__":
    main()
