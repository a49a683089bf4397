"""The bare loop: the worker's own decode + augment + batch code, no sockets, one process.

Prints one JSON line: images, seconds, images/s (the first batch is warm-up, not timed).
"""

from __future__ import annotations

import argparse
import json
import time

from pipeline.augment import TrainTransform
from pipeline.batching import HostTransform, unit_batches
from pipeline.plan import EpochPlan
from pipeline.shards import Manifest, ShardReader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--unit-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    manifest = Manifest.load(args.manifest)
    plan = EpochPlan(manifest, args.batch_size * args.unit_batches, 1, args.seed)
    readers: dict[int, ShardReader] = {}

    def reader_of(shard: int) -> ShardReader:
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    images, started = 0, None
    for unit in plan.units(0):
        for batch in unit_batches(reader_of, unit, HostTransform(TrainTransform()), args.batch_size, args.seed):
            if started is None:
                started = time.perf_counter()  # after the first batch: warm-up
                continue
            images += len(batch.sample_ids)
    seconds = time.perf_counter() - started
    print(json.dumps({"images": images, "seconds": seconds, "images_per_s": images / seconds}))


if __name__ == "__main__":
    main()
