"""Service overhead: the bare decode+augment loop vs `stoker` end to end, one core each.

(a) bare: benchmarks.bare_loop pinned to core 0.
(b) stoker: one `stoker worker` daemon with one decode process pinned to core 0, sending over
    loopback ZeroMQ to a null consumer (+ dispatcher) pinned to core 1.
Runs alternate a, b, a, b, ... and the medians and their ratio are written to
benchmarks/results/spine.{json,md}. Target: b >= 0.9 x a (the service costs under 10%).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import run_with_worker
from benchmarks.report import header, write_results
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.datasets import default_imagenet
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest

WORKER_CORE, CONSUMER_CORE = "0", 1


def run_bare(manifest: str) -> float:
    out = subprocess.run(["taskset", "-c", WORKER_CORE, sys.executable, "-m", "benchmarks.bare_loop",
                          "--manifest", manifest], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def run_stoker(manifest: str) -> float:
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0)
    consumer = Consumer(cfg, JobConfig(manifest_uri=manifest, epochs=1))
    summary = run_with_worker(consumer, WORKER_CORE)
    assert summary.unique_samples == summary.samples == consumer.manifest.num_samples
    return summary.delivered_samples_per_s


def main(repeats: int = 3) -> dict:
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("the spine benchmark needs two cores (worker and consumer on separate cores)")
    manifest = str(default_imagenet())
    os.sched_setaffinity(0, {CONSUMER_CORE})
    for path in Path(manifest).parent.glob("*.arrow"):  # warm the page cache
        path.read_bytes()
    bare, stoker = [], []
    for i in range(repeats):
        bare.append(run_bare(manifest))
        stoker.append(run_stoker(manifest))
        print(f"round {i + 1}: bare {bare[-1]:.0f} img/s, stoker {stoker[-1]:.0f} img/s", flush=True)
    result = {
        **header("spine", "pillow-simd"),
        "images": Manifest.load(manifest).num_samples,
        "repeats": repeats,
        "bare_loop_images_per_s": bare,
        "stoker_images_per_s": stoker,
        "bare_median": statistics.median(bare),
        "stoker_median": statistics.median(stoker),
    }
    result["ratio"] = result["stoker_median"] / result["bare_median"]
    table = ("| contender (1 decode core, train transform, batch 64) | images/s per core, median of "
             f"{repeats} |\n|---|---|\n"
             f"| (a) bare decode+augment loop, one process | {result['bare_median']:.0f} |\n"
             f"| (b) `stoker worker` -> ZeroMQ -> null consumer | {result['stoker_median']:.0f} |\n"
             f"| ratio (b)/(a) | {result['ratio']:.3f} |\n")
    write_results("spine", result, table)
    print(table)
    return result

