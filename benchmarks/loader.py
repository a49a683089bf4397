"""Loader overhead: a training loop fed by `stoker.Loader` against the same loop over tensors in memory.

The loop's step is a timed wait (80 ms per batch of 64 images at 224 px: 800 img/s, which one
worker core here keeps up with), so what differs between the two is only how the next batch
arrives: (a) pre-made torch tensors from a list; (b) `for batch in loader` (torch format on
the CPU), fed by one `stoker worker` daemon pinned to core 0, the loop on core 1. Runs
alternate a, b, a, b; medians of 3 go to benchmarks/results/loader.{json,md}. Target:
b >= 0.98 x a.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.report import header, write_results
from stoker.accel.consumer import ConsumerConfig
from stoker.datasets import default_imagenet
from stoker.loader import Loader
from stoker.pipeline.job import JobConfig

STEP_S = 0.080
BATCH = 64
STEPS = 120
WORKER_CORE, LOOP_CORE = "0", 1


def _step(images: torch.Tensor, labels: torch.Tensor) -> None:
    """What a device would do meanwhile: touch the batch, then wait out the step time."""
    started = time.perf_counter()
    assert images.shape[0] == labels.shape[0]
    while (left := STEP_S - (time.perf_counter() - started)) > 0:
        time.sleep(left)


def in_memory() -> float:
    batches = [(torch.zeros((BATCH, 224, 224, 3), dtype=torch.uint8), torch.zeros(BATCH, dtype=torch.int32))
               for _ in range(8)]
    started = time.perf_counter()
    for i in range(STEPS):
        _step(*batches[i % len(batches)])
    return STEPS / (time.perf_counter() - started)


def fed_by_loader(manifest: str) -> float:
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None)
    epochs = -(-STEPS * BATCH // 2000) + 1
    loader = Loader(JobConfig(manifest_uri=manifest, epochs=epochs, batch_size=BATCH), config=cfg, rank=0,
                    world_size=1)
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with loader:
        worker = subprocess.Popen(["taskset", "-c", WORKER_CORE, sys.executable, "-m", "stoker", "worker", "--connect",
                                   loader.consumer.control_endpoint, "--host-id", "bench", "--no-metrics"], env=env)
        try:
            steps, started = 0, None
            while steps < STEPS + 5:
                for batch in loader:
                    _step(batch["image"], batch["label"])
                    steps += 1
                    if steps == 5:  # after start-up: the worker's first batches
                        started = time.perf_counter()
                    if steps == STEPS + 5:
                        break
            return STEPS / (time.perf_counter() - started)
        finally:
            worker.terminate()
            worker.wait(30)


def main(repeats: int = 3) -> dict:
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("the loader benchmark needs two cores (worker and loop on separate cores)")
    manifest = str(default_imagenet())
    os.sched_setaffinity(0, {LOOP_CORE})
    torch.set_num_threads(1)
    memory, loader = [], []
    for i in range(repeats):
        memory.append(in_memory())
        loader.append(fed_by_loader(manifest))
        print(f"round {i + 1}: in memory {memory[-1]:.2f} steps/s, loader {loader[-1]:.2f} steps/s", flush=True)
    result = {**header("loader", "torch"), "step_s": STEP_S, "batch": BATCH, "steps": STEPS,
              "in_memory_steps_per_s": memory, "loader_steps_per_s": loader,
              "in_memory_median": statistics.median(memory), "loader_median": statistics.median(loader),
              "ratio": statistics.median(loader) / statistics.median(memory)}
    table = ("| training loop, 80 ms step, batch 64 at 224 px, loop on core 1 | steps/s, median of 3 |\n"
             "|---|---|\n"
             f"| (a) over pre-made tensors in memory | {result['in_memory_median']:.2f} |\n"
             f"| (b) `for batch in stoker.Loader(...)`, 1 worker process on core 0 | {result['loader_median']:.2f} |\n"
             f"| ratio (b)/(a) | {result['ratio']:.3f} (target >= 0.98) |\n")
    write_results("loader", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
