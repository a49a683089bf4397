"""GPU check: ResNet-50 in bf16 on one CUDA GPU, fed by Stoker workers on the same machine's cores.

    python -m benchmarks.gpu_check              # on a machine with a CUDA GPU (16 cores: under 8 minutes)
    python -m benchmarks.gpu_check --dry-run    # the same runs, tiny, on the CPU: checks the script itself

It needs a CUDA build of PyTorch in the environment (the project pins the CPU build for this
2-core development machine): `pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130`.

Four measurements, each a full `stoker run` with worker daemons on this machine:
  ceiling      the training step alone on one device-resident batch (no input path)
  overlap      host decoding, batch N+1 converted/copied on a side stream during step N
  serial       host decoding, `--no-overlap`
  decode-on-accelerator   workers ship JPEG bytes + crops, DALI "mixed" (nvJPEG) decodes on the GPU
Printed: images/s, stall fraction, the overlap gain (overlap / serial) and each run's share of
the ceiling; written to benchmarks/results/gpu_check.{json,md} (not for a dry run).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import asdict, dataclass, replace

import torch

from benchmarks.report import header, write_results
from stoker.accel.backends.accelerators import AccelSpec, make_accelerator
from stoker.accel.consumer import ConsumerConfig
from stoker.embedded import RunConfig, run_embedded, run_manifest
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import IMAGENET


@dataclass(frozen=True)
class CheckConfig:
    device: str = "cuda"
    model: str = "resnet50"
    width: int = 64
    precision: str = "bf16"
    image_size: int = 224
    batch_size: int = 256
    images: int = 8000  # the generated set; each run reads it `epochs` times
    epochs: int = 2
    procs: int = max(1, (os.cpu_count() or 2) - 2)  # leave two cores to the consumer's threads
    decode_threads: int = 4
    data: str | None = None  # a manifest; None: the generated set of `images` images

    @classmethod
    def dry_run(cls) -> CheckConfig:
        return cls(device="cpu", model="resnet18", width=16, precision="fp32", image_size=64, batch_size=32,
                   images=2000, epochs=1, procs=1, decode_threads=1)


def _spec(cfg: CheckConfig) -> AccelSpec:
    return AccelSpec(kind="torch", model=cfg.model, device=cfg.device, width=cfg.width, lr=0.1,
                     precision=cfg.precision)


def ceiling(cfg: CheckConfig, steps: int = 20) -> float:
    """Images/s of the step alone, on one batch already on the device."""
    accel = make_accelerator(_spec(cfg), "imagenet", 1000)

    class Batch:
        images = torch.randint(0, 256, (cfg.batch_size, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8,
                               device=cfg.device)
        labels = torch.randint(0, 1000, (cfg.batch_size,)).numpy()

    prepared = accel.prepare(Batch())
    for _ in range(3):  # warm-up: cuDNN picks its algorithms
        accel.step_prepared(prepared)
    _sync(cfg.device)
    started = time.perf_counter()
    for _ in range(steps):
        accel.step_prepared(prepared)
    _sync(cfg.device)
    return steps * cfg.batch_size / (time.perf_counter() - started)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fed(cfg: CheckConfig, overlap: bool, decode_on: DecodeOn) -> dict:
    run = RunConfig(hosts=1, procs=cfg.procs, accel=_spec(cfg), progress=False, worker_metrics_port=None,
                    consumer=ConsumerConfig(metrics_port=None, overlap=overlap, decode_threads=cfg.decode_threads))
    job = JobConfig(manifest_uri=run_manifest(cfg.data, IMAGENET.name, cfg.images, progress=False), epochs=cfg.epochs,
                    batch_size=cfg.batch_size, image_size=cfg.image_size, decode_on=decode_on)
    summary = run_embedded(job, run)[0]  # one rank
    return {"images_per_s": summary.delivered_samples_per_s, "stall_fraction": summary.stall_fraction,
            "images": summary.rows, "skipped": summary.skipped_samples, "stage_seconds": summary.stage_seconds}


def _stall(run: dict) -> str:
    return f"{100 * run['stall_fraction']:.1f}%" if "stall_fraction" in run else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny runs on the CPU (no GPU needed)")
    parser.add_argument("--data", help="a manifest to read instead of the generated set")
    args = parser.parse_args(argv)
    cfg = replace(CheckConfig.dry_run() if args.dry_run else CheckConfig(), data=args.data)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"no CUDA device visible to torch {torch.__version__}: install a CUDA build of torch "
                         f"(see this file's docstring) or pass --dry-run")
    started = time.perf_counter()
    device_name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"gpu check on {device_name}: {cfg.model} {cfg.precision} batch {cfg.batch_size} at {cfg.image_size} px, "
          f"{cfg.procs} worker processes", flush=True)
    runs = {"ceiling": {"images_per_s": ceiling(cfg)}}
    print(f"  ceiling (step alone): {runs['ceiling']['images_per_s']:.0f} img/s", flush=True)
    for name, overlap, decode_on in (("overlap", True, DecodeOn.HOST), ("serial", False, DecodeOn.HOST),
                                     ("decode-on-accelerator", True, DecodeOn.ACCELERATOR)):
        runs[name] = fed(cfg, overlap, decode_on)
        print(f"  {name}: {runs[name]['images_per_s']:.0f} img/s, stall {100 * runs[name]['stall_fraction']:.1f}%",
              flush=True)
    top = runs["ceiling"]["images_per_s"]
    result = {**header("gpu_check", "torch", "nvidia-dali-cuda130", "pillow-simd"), "device": device_name,
              "cores": os.cpu_count(), "config": asdict(cfg), "runs": runs,
              "overlap_gain": runs["overlap"]["images_per_s"] / runs["serial"]["images_per_s"],
              "share_of_ceiling": {k: v["images_per_s"] / top for k, v in runs.items()},
              "seconds": time.perf_counter() - started, "dry_run": args.dry_run}
    rows = "\n".join(f"| {k} | {v['images_per_s']:.0f} | "
                     f"{_stall(v)} | "
                     f"{100 * result['share_of_ceiling'][k]:.0f}% |" for k, v in runs.items())
    table = (f"GPU check on {device_name} ({os.cpu_count()} cores), {cfg.model} {cfg.precision}, batch "
             f"{cfg.batch_size}, {cfg.procs} worker processes{' (dry run on the CPU)' if args.dry_run else ''}\n\n"
             f"| run | images/s | stall | of ceiling |\n|---|---|---|---|\n{rows}\n\n"
             f"Overlap gain (overlap / serial): {result['overlap_gain']:.2f}x. "
             f"Command: `python -m benchmarks.gpu_check{' --dry-run' if args.dry_run else ''}`\n")
    print(table)
    if not args.dry_run:  # a dry run checks the script; its figures are not a result
        write_results("gpu_check", result, table)
    print(f"took {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
