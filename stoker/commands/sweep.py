"""`stoker sweep`: the CPU:accelerator ratio experiment on the emulated cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from stoker.commands.common import check_transform, floats, ints, transform_options
from stoker.flags import POSITIVE, SECONDS


def add_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="the CPU:accelerator ratio experiment on the emulated cluster")
    sweep.add_argument("--dataset", choices=("imagenet", "wikipedia"), default="imagenet",
                       help="the data set to sweep (default %(default)s)")
    sweep.add_argument("--hosts", type=ints, default=(1, 2, 3, 4), help="comma-separated (default 1,2,3,4)")
    sweep.add_argument("--cores-per-host", type=floats, default=(),
                       help="comma-separated CPU quotas (default 0.25,0.5 for imagenet, 0.05,0.1,0.2 for wikipedia)")
    sweep.add_argument("--procs", type=ints, default=(1,), help="worker processes per host, comma-separated")
    sweep.add_argument("--profile", default="ipu-pod16", help="simulated accelerator (default ipu-pod16)")
    sweep.add_argument("--scale", type=SECONDS, help="shrink the profile (default 0.03 imagenet, 1.0 wikipedia)")
    sweep.add_argument("--seconds", type=SECONDS, default=10.0, help="steady measurement per point (default 10)")
    sweep.add_argument("--data", help="manifest (default: the dataset's generated/fetched set)")
    sweep.add_argument("--out", type=Path, help="results folder (default sweeps/DATASET, sweeps/imagenet-TRANSFORM for "
                                                "another transform); rerun to resume")
    sweep.add_argument("--loopback", action="store_true", help="no namespaces (no CPU quotas without root)")
    sweep.add_argument("--ranks", type=POSITIVE, default=1,
                       help="feed the system as this many data-parallel ranks, each 1/ranks of its rate (default 1)")
    transform_options(sweep, "train")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("train_args", nargs=argparse.REMAINDER,
                       help="after --: more `stoker train` options; `-- --accel torch --model resnet18 "
                            "--image-size 112` sweeps against a real step instead of the profile")


def run(args: argparse.Namespace) -> int:
    from stoker.datasets import default_manifest
    from stoker.pipeline.transforms import parse_params
    from stoker.sweep import SweepConfig, default_out, run_sweep, write_outputs

    params = parse_params(args.transform_params)
    out = args.out or default_out(args.dataset, args.transform, params)
    cfg = SweepConfig(out=out, dataset=args.dataset, hosts=args.hosts, cores_per_host=args.cores_per_host,
                      procs=args.procs, profile=args.profile, scale=args.scale, seconds=args.seconds,
                      data=args.data, loopback=args.loopback, ranks=args.ranks,
                      train_args=tuple(a for a in args.train_args if a != "--"), transform=args.transform,
                      transform_params=params)
    manifest = args.data or str(default_manifest(args.dataset))
    points = run_sweep(cfg, manifest, progress=not args.no_progress)
    paths = write_outputs(points, out)
    print((out / "sweep.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


check = check_transform
