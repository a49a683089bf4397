"""Overlap of host work with compute, and what the input path costs a real training step.

Part 1, a simulated device fed like a real one: each batch is converted on the host (uint8 to
normalised float32 NCHW) before a step that sleeps 64/700 s (just above what one worker
process on core 0 supplies). With overlap the consumer's prefetch thread converts batch N+1
during step N; without it, conversion adds to every step. Reported: images/s, stall
fraction, and the share of conversion time hidden = 1 - stall seconds / conversion seconds.

Part 2, real ResNet-18 steps on the CPU: fed by Stoker (overlap on and off) vs pre-made tensors in memory.

The "accelerator" is core 1 (one torch thread, the consumer pinned there); one worker process
decodes on core 0. (a) in memory: the same prepared batches stepped back to back; (b) Stoker
with the prefetch thread converting batch N+1 during step N; (c) Stoker with conversion
between steps (--no-overlap). Steps/s after the first batch, medians of `repeats`
interleaved runs, written to benchmarks/results/overlap.{json,md}.
Target: (b) within 5% of (a).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace

import torch

from benchmarks.common import run_with_worker
from benchmarks.report import header, write_results
from stoker.accel.backends.accelerators import AccelSpec, make_accelerator
from stoker.accel.backends.torch_accel import TorchAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.datasets import default_imagenet
from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.job import JobConfig
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import Manifest, ShardReader

SIZE, BATCH, EPOCHS = 112, 32, 1
SPEC = AccelSpec(kind="torch", model="resnet18", lr=0.05)


def _accelerator(classes: int) -> TorchAccelerator:
    torch.manual_seed(0)
    return make_accelerator(SPEC, "imagenet", classes)


def in_memory(manifest: Manifest, steps: int) -> float:
    """The same kind of batches, decoded beforehand, stepped back to back."""
    reader = ShardReader(manifest.shard_uri(0))
    accel = _accelerator(len(manifest.classes))

    class Batch:  # what prepare() reads from a received batch
        def __init__(self, start: int) -> None:
            rows = range(start, start + BATCH)
            self.images = torch.from_numpy(__import__("numpy").stack([
                decode_augment(reader.jpeg(r), TrainTransform(size=SIZE), sample_random(0, 0, r)).pixels
                for r in rows])).numpy()
            self.labels = __import__("numpy").array([reader.label(r) for r in rows], dtype="int32")

    prepared = [accel.prepare(Batch(i * BATCH)) for i in range(4)]
    accel.step_prepared(prepared[0])  # warm-up
    started = time.perf_counter()
    for i in range(steps):
        accel.step_prepared(prepared[i % len(prepared)])
    return steps / (time.perf_counter() - started)


def fed(manifest_uri: str, overlap: bool) -> tuple[float, float]:
    """Steps/s and stall fraction after the first batch, one worker process on core 0."""
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None,
                         overlap=overlap)
    job = JobConfig(manifest_uri=manifest_uri, epochs=EPOCHS, batch_size=BATCH, image_size=SIZE)
    consumer = Consumer(cfg, job, given(_accelerator(len(Manifest.load(manifest_uri).classes))))
    summary = run_with_worker(consumer, "0")
    steady = summary.elapsed_s - summary.startup_s
    return (summary.batches - 1) / steady, summary.stall_fraction


SIM_RATE = 700.0


def simulated(manifest_uri: str, overlap: bool) -> dict:
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None,
                         overlap=overlap)
    accel = make_accelerator(AccelSpec(kind="simulated", rate=SIM_RATE, convert=True), "imagenet", 0)
    summary = run_with_worker(Consumer(cfg, JobConfig(manifest_uri=manifest_uri, epochs=2), given(accel)), "0")
    stages = summary.stage_seconds
    return {"images_per_s": summary.delivered_samples_per_s, "stall_fraction": summary.stall_fraction,
            "convert_s": stages["copy"], "stall_s": stages["stall"],
            "hidden": 1 - stages["stall"] / stages["copy"] if overlap else 0.0}


def main(repeats: int = 3) -> dict:
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {1})
    manifest_uri = str(default_imagenet())
    manifest = Manifest.load(manifest_uri)
    sim_on, sim_off = [], []
    for i in range(repeats):
        sim_on.append(simulated(manifest_uri, True))
        sim_off.append(simulated(manifest_uri, False))
        print(f"simulated round {i + 1}: overlap {sim_on[-1]['images_per_s']:.0f} img/s, "
              f"serial {sim_off[-1]['images_per_s']:.0f} img/s", flush=True)

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    sim = {"overlap": {k: med(sim_on, k) for k in sim_on[0]}, "serial": {k: med(sim_off, k) for k in sim_off[0]},
           "rate": SIM_RATE}
    memory, over, serial, stall_over, stall_serial = [], [], [], [], []
    for i in range(repeats):
        memory.append(in_memory(manifest, 30))
        rate, stall = fed(manifest_uri, True)
        over.append(rate)
        stall_over.append(stall)
        rate, stall = fed(manifest_uri, False)
        serial.append(rate)
        stall_serial.append(stall)
        print(f"round {i + 1}: in memory {memory[-1]:.2f}, overlap {over[-1]:.2f}, serial {serial[-1]:.2f} steps/s",
              flush=True)
    m = {"in_memory": statistics.median(memory), "overlap": statistics.median(over),
         "serial": statistics.median(serial)}
    result = {**header("overlap", "torch"),
              "model": replace(SPEC).model, "image_size": SIZE, "batch": BATCH, "repeats": repeats,
              "steps_per_s": {"in_memory": memory, "overlap": over, "serial": serial}, "medians": m,
              "stall_fraction": {"overlap": statistics.median(stall_over), "serial": statistics.median(stall_serial)},
              "ratio_overlap_to_memory": m["overlap"] / m["in_memory"],
              "ratio_serial_to_memory": m["serial"] / m["in_memory"], "simulated": sim}
    so, ss = sim["overlap"], sim["serial"]
    table = (f"| simulated device at {SIM_RATE:.0f} img/s + host conversion, 1 worker process on core 0 | "
             f"images/s | stall | conversion hidden |\n|---|---|---|---|\n"
             f"| overlap | {so['images_per_s']:.0f} | {100 * so['stall_fraction']:.1f}% | {100 * so['hidden']:.1f}% |\n"
             f"| `--no-overlap` | {ss['images_per_s']:.0f} | {100 * ss['stall_fraction']:.1f}% | - |\n\n")
    table += (f"| ResNet-18 at {SIZE} px, batch {BATCH}, 1 torch thread on core 1, 1 worker process on core 0 "
             f"| steps/s (median of {repeats}) | stall |\n|---|---|---|\n"
             f"| (a) pre-made tensors in memory | {m['in_memory']:.2f} | - |\n"
             f"| (b) Stoker-fed, overlap (batch N+1 converted during step N) | {m['overlap']:.2f} "
             f"({result['ratio_overlap_to_memory']:.2f}x) | {100 * result['stall_fraction']['overlap']:.1f}% |\n"
             f"| (c) Stoker-fed, `--no-overlap` | {m['serial']:.2f} ({result['ratio_serial_to_memory']:.2f}x) | "
             f"{100 * result['stall_fraction']['serial']:.1f}% |\n")
    write_results("overlap", result, table)
    print(table)
    return result
