"""What a team's own augmentation costs in host cores: the TrivialAugment example against the MLPerf crop.

On every image of the default set, through the worker's own path (`unit_batches` + `HostTransform`:
crop-window decode at the DCT scale the output needs, then the transform), on one pinned core:

- the MLPerf random-resized crop + flip at 224 px (`stoker run`'s default);
- the same crop at 176 px (FFCV-style low resolution: fewer pixels to decode and resize);
- examples/trivialaugment at 176 px: that crop, then one TrivialAugment-Wide operation (pillow-simd).

Each pass is a process of its own (as a worker process runs one transform; transforms sharing a
process moved each other's figures), warmed on one unit, timed in its own CPU seconds (the machine
is shared); the three alternate, the order turning every round, medians of `rounds`. From each
per-core rate: the host cores that feed one accelerator system of each profile with stall under 2%
(`stoker.planning`, as `stoker plan` computes them), and where TrivialAugment's time goes, per
operation. The figures go to benchmarks/results/transform_example.{json,md}.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.report import CoreWatch, header, write_results
from stoker.datasets import default_imagenet
from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.job import JOB_DEFAULTS
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import Manifest, ShardReader
from stoker.planning import SYSTEMS, PlanInput, make_plan

CORE = 0
BATCH = 64
SYSTEMS_SHOWN = ("a100", "h100", "dgx-a100", "ipu-pod16")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trivialaugment"


def example():
    """The example package: installed (`pip install ./examples/trivialaugment`), else from its folder."""
    try:
        return importlib.import_module("stoker_trivialaugment")
    except ImportError:
        sys.path.insert(0, str(EXAMPLE))
        return importlib.import_module("stoker_trivialaugment")


def transforms() -> dict[str, object]:
    return {"mlperf crop 224": TrainTransform(size=224), "mlperf crop 176": TrainTransform(size=176),
            "trivialaugment 176": example().TrivialAugmentWide(size=176)}


def _reader_of(manifest: Manifest):
    readers: dict[int, ShardReader] = {}

    def reader_of(shard: int) -> ShardReader:  # each shard opened (and checked) once
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    return reader_of


def one_pass(name: str) -> dict:
    """In this process: every image of the set through `name` as a worker makes them, after one unit
    to warm; images per CPU second, and decode and augment per image."""
    os.sched_setaffinity(0, {CORE})
    manifest = Manifest.load(str(default_imagenet()))
    reader_of, units, transform = _reader_of(manifest), EpochPlan(manifest, BATCH * 4, 1, 0).units(0), \
        transforms()[name]
    work, images, decode_s, augment_s = HostTransform(transform, timeout_s=JOB_DEFAULTS["transform_timeout_s"]), 0, \
        0.0, 0.0
    for _ in unit_batches(reader_of, units[0], work, BATCH, 0):
        pass
    started, started_cpu = time.perf_counter(), time.thread_time()
    for unit in units:
        for batch in unit_batches(reader_of, unit, work, BATCH, 0):
            images += len(batch.sample_ids)
            decode_s += batch.decode_s
            augment_s += batch.augment_s
    cpu = time.thread_time() - started_cpu
    return {"images": images, "cpu_seconds": cpu, "seconds": time.perf_counter() - started,
            "images_per_s": images / cpu, "decode_ms": 1000 * decode_s / images,
            "augment_ms": 1000 * augment_s / images}


def _spawn(name: str) -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "benchmarks.transform_example", name], capture_output=True, text=True,
                         check=True, cwd=root, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_op_ms(reader: ShardReader, images: int = 40, repeats: int = 3) -> dict[str, float]:
    """CPU milliseconds per TrivialAugment-Wide operation on the example's 176-px crops, over the
    magnitudes (the best of `repeats`)."""
    ta = example()
    crops = [Image.fromarray(decode_augment(reader.jpeg(row), TrainTransform(size=176), sample_random(0, 0, row),
                                            restarts=reader.restarts(row)).pixels) for row in range(images)]
    out = {}
    for op in ta.OPS:
        magnitudes = [op.magnitude(i % ta.NUM_BINS) for i in range(images)]
        best = float("inf")
        for _ in range(repeats):
            started = time.thread_time()
            for image, magnitude in zip(crops, magnitudes, strict=True):
                np.asarray(op.apply(image, magnitude))
            best = min(best, time.thread_time() - started)
        out[op.name] = 1000 * best / images
    return out


def main(rounds: int = 3) -> dict:
    os.sched_setaffinity(0, {CORE})
    manifest = Manifest.load(str(default_imagenet()))
    chosen, passes = transforms(), []
    for number in range(rounds):
        names = list(chosen)
        for name in names[number % len(names):] + names[:number % len(names)]:
            passes.append({"round": number, "transform": name, **_spawn(name)})
    with CoreWatch(CORE) as watch:
        ops = per_op_ms(_reader_of(manifest)(0))
    measured = {name: {key: statistics.median(p[key] for p in passes if p["transform"] == name)
                       for key in ("images_per_s", "decode_ms", "augment_ms")} for name in chosen}
    cores = {system: {name: make_plan(PlanInput(system=system, dataset="imagenet",
                                                per_core_rate=m["images_per_s"])).cores_needed
                      for name, m in measured.items()} for system in SYSTEMS_SHOWN}
    rates = {system: make_plan(PlanInput(system=system, dataset="imagenet", per_core_rate=1.0)).accel_rate
             for system in SYSTEMS_SHOWN}
    ta = example()
    result = {**header("transform_example", "pillow-simd", "stoker"), "images": passes[0]["images"], "core": CORE,
              "rounds": rounds, "passes": passes, "measured": measured, "system_rates": rates, "cores_needed": cores,
              "stall_target": PlanInput("", "", 1.0).stall_target, "trivialaugment_op_ms": ops,
              "example": {"package": "stoker-trivialaugment", "version": ta.__version__,
                          "params": {"size": 176}}, **watch.as_dict()}
    result["versions"]["stoker-trivialaugment"] = ta.__version__
    table = markdown(result)
    write_results("transform_example", result, table)
    print(table)
    return result


def markdown(result: dict) -> str:
    names = list(result["measured"])
    v = result["versions"]
    lines = [f"`python -m benchmarks transform_example`: {result['images']} images of the default set per pass, "
             f"through the worker's path (`unit_batches` + `HostTransform`), core {result['core']}, each pass a "
             f"process of its own, in its CPU seconds, medians of {result['rounds']} alternating rounds; "
             f"pillow-simd {v['pillow-simd']}, numpy {v['numpy']}, stoker "
             f"{v['stoker']}, stoker-trivialaugment {v['stoker-trivialaugment']}.", "",
             "| per core | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
             "| images per CPU second | " + " | ".join(f"{result['measured'][n]['images_per_s']:,.0f}" for n in names)
             + " |",
             "| against the MLPerf crop at 224 | " + " | ".join(
                 f"{result['measured'][n]['images_per_s'] / result['measured'][names[0]]['images_per_s']:.2f}x"
                 for n in names) + " |",
             "| decode ms per image | " + " | ".join(f"{result['measured'][n]['decode_ms']:.2f}" for n in names)
             + " |",
             "| augment ms per image (resize, flip, the transform) | "
             + " | ".join(f"{result['measured'][n]['augment_ms']:.2f}" for n in names) + " |", "",
             f"| host cores needed (stall < {100 * result['stall_target']:.0f}%) | images/s when fed | "
             + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for system, by_name in result["cores_needed"].items():
        s = SYSTEMS[system]
        shown = f"{system} ({s.count} x {s.profile})" if s.count > 1 else system
        lines.append(f"| {shown} | {result['system_rates'][system]:,.0f} | "
                     + " | ".join(str(by_name[n]) for n in names) + " |")
    ops = result["trivialaugment_op_ms"]
    lines += ["", "TrivialAugment-Wide per operation at 176 px, CPU ms (each drawn 1 time in 14): "
              + ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(ops.items(), key=lambda kv: -kv[1])), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 2:  # one pass, from main()
        print(json.dumps(one_pass(sys.argv[1])))
    else:
        main()
