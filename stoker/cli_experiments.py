"""The ratio-experiment commands: `stoker sweep`, `stoker calibrate`, `stoker plan`, `stoker status`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stoker.flags import POSITIVE, SECONDS, float_in
from stoker.options import emit_json, json_option

DEFAULT_CALIBRATION = Path("stoker-calibration.json")
PRICE = float_in(0.0, low_open=False)


def _floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0."""
    return tuple(SECONDS(v) for v in text.split(",") if v)


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1."""
    return tuple(POSITIVE(v) for v in text.split(",") if v)


def add_parsers(sub) -> None:
    sweep = sub.add_parser("sweep", help="the CPU:accelerator ratio experiment on the emulated cluster")
    sweep.add_argument("--dataset", choices=("imagenet", "wikipedia"), default="imagenet")
    sweep.add_argument("--hosts", type=_ints, default=(1, 2, 3, 4), help="comma-separated (default 1,2,3,4)")
    sweep.add_argument("--cores-per-host", type=_floats, default=(),
                       help="comma-separated CPU quotas (default 0.25,0.5 for imagenet, 0.05,0.1,0.2 for wikipedia)")
    sweep.add_argument("--procs", type=_ints, default=(1,), help="worker processes per host, comma-separated")
    sweep.add_argument("--profile", default="ipu-pod16", help="simulated accelerator (default ipu-pod16)")
    sweep.add_argument("--scale", type=SECONDS, help="shrink the profile (default 0.03 imagenet, 1.0 wikipedia)")
    sweep.add_argument("--seconds", type=SECONDS, default=10.0, help="steady measurement per point (default 10)")
    sweep.add_argument("--data", help="manifest (default: the dataset's generated/fetched set)")
    sweep.add_argument("--out", type=Path, help="results folder (default sweeps/DATASET); rerun to resume")
    sweep.add_argument("--loopback", action="store_true", help="no namespaces (no CPU quotas without root)")
    sweep.add_argument("--ranks", type=POSITIVE, default=1,
                       help="feed the system as this many data-parallel ranks, each 1/ranks of its rate (default 1)")
    sweep.add_argument("--no-progress", action="store_true")
    sweep.add_argument("train_args", nargs=argparse.REMAINDER,
                       help="after --: more `stoker train` options; `-- --accel torch --model resnet18 "
                            "--image-size 112` sweeps against a real step instead of the profile")

    cal = sub.add_parser("calibrate", help="per-core supply rates of this machine (under a minute)")
    cal.add_argument("--seconds", type=SECONDS, default=15.0, help="per dataset (default 15)")
    cal.add_argument("--out", type=Path, default=DEFAULT_CALIBRATION)

    plan = sub.add_parser("plan", help="cores, hosts, time-to-train and performance per dollar for a system")
    plan.add_argument("--system", default="dgx-a100", help="ipu-pod16, ipu-pod64, dgx-a100, a100, h100")
    plan.add_argument("--compare", help="comma-separated systems, e.g. ipu-pod16,dgx-a100 (last is the baseline)")
    plan.add_argument("--dataset", choices=("imagenet", "wikipedia", "both"), default="both")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--calibration", type=Path, help=f"from `stoker calibrate` (default {DEFAULT_CALIBRATION})")
    source.add_argument("--sweep", type=Path, nargs="+", help="sweep folders: per-core rates from their host-bound "
                                                              "points")
    plan.add_argument("--per-core-rate", type=SECONDS, help="samples/s per host core (overrides both)")
    plan.add_argument("--stall-target", type=float_in(0.0, 1.0, low_open=False), default=0.02)
    plan.add_argument("--cores-per-host", type=POSITIVE, default=64)
    plan.add_argument("--host-price", type=PRICE, help="US$ per host server (default 25,000: an assumption)")
    plan.add_argument("--accel-price", type=PRICE, help="US$ for the system (default: its list price, if known)")
    plan.add_argument("--samples", type=SECONDS, help="samples to train (default: MLPerf's, see stoker/planning.py)")
    json_option(plan, "the plans")

    status = sub.add_parser("status", help="what bounds a running job's throughput, from its consumer's metrics")
    status.add_argument("--metrics", default="http://127.0.0.1:9560/metrics", help="the consumer's /metrics URL")
    json_option(status, "the figures (with --watch: one line per refresh)")
    status.add_argument("--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float_in(0.1), default=1.0, help="--watch: seconds between refreshes")
    status.add_argument("--count", type=POSITIVE, help="--watch: stop after this many refreshes")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from stoker.datasets import default_manifest
    from stoker.sweep import SweepConfig, run_sweep, write_outputs

    out = args.out or Path("sweeps") / args.dataset
    cfg = SweepConfig(out=out, dataset=args.dataset, hosts=args.hosts, cores_per_host=args.cores_per_host,
                      procs=args.procs, profile=args.profile, scale=args.scale, seconds=args.seconds,
                      data=args.data, loopback=args.loopback, ranks=args.ranks,
                      train_args=tuple(a for a in args.train_args if a != "--"))
    manifest = args.data or str(default_manifest(args.dataset))
    points = run_sweep(cfg, manifest, progress=not args.no_progress)
    paths = write_outputs(points, out)
    print((out / "sweep.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from stoker.calibrate import calibrate
    from stoker.datasets import default_imagenet, default_wikipedia

    result = calibrate(str(default_imagenet()), str(default_wikipedia()), args.seconds, args.out)
    for name in ("imagenet", "wikipedia"):
        r = result[name]
        print(f"{name}: {r['per_core_rate']:,.0f} {r['unit']} per core ({r['what']})")
    print(f"written to {args.out}")
    return 0


def _per_core_rates(args: argparse.Namespace) -> dict[str, float]:
    from stoker.sweep import load_points, per_core_rate

    if args.sweep:
        rates = {}
        for folder in args.sweep:
            points = load_points(folder)
            rate = per_core_rate(points)
            if rate is None:
                raise ValueError(f"{folder}: no host-bound point (stall > 10%) to read a per-core rate from")
            rates[points[0].dataset] = rate  # rows/s per core: the scale shrinks the device, not the cores
        return rates
    path = args.calibration or DEFAULT_CALIBRATION
    if not path.exists():
        raise ValueError(f"{path} does not exist: run `stoker calibrate` first, or pass --sweep DIR or --per-core-rate")
    data = json.loads(path.read_text())
    return {name: data[name]["per_core_rate"] for name in ("imagenet", "wikipedia")}


def _cmd_plan(args: argparse.Namespace) -> int:
    from stoker.planning import DEFAULT_HOST_PRICE, PlanInput, compare, describe, make_plan

    datasets = ("imagenet", "wikipedia") if args.dataset == "both" else (args.dataset,)
    rates = {d: args.per_core_rate for d in datasets} if args.per_core_rate else _per_core_rates(args)
    systems = args.compare.split(",") if args.compare else [args.system]
    out = []
    for dataset in datasets:
        if dataset not in rates:
            raise ValueError(f"no per-core rate for {dataset}: sweep it too, or pass --per-core-rate")
        plans = [make_plan(PlanInput(system=s, dataset=dataset, per_core_rate=rates[dataset],
                                     stall_target=args.stall_target, cores_per_host=args.cores_per_host,
                                     host_price=args.host_price or DEFAULT_HOST_PRICE, accel_price=args.accel_price,
                                     samples=args.samples)) for s in systems]
        for plan in plans:
            print(describe(plan))
        if len(plans) > 1:
            print(compare(plans))
        out += [p.as_dict() for p in plans]
    emit_json(args.json, out, "plans")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from accel.bottleneck import read_status

    if not args.watch:
        status = read_status(args.metrics)
        if args.json:
            emit_json(args.json, status, "status")
        else:
            print(status["text"])
        return 0
    return _watch(args)


def _watch(args: argparse.Namespace) -> int:
    """Redraw the job's figures in place (or, with --json or off a terminal, one frame after another)."""
    import sys
    import time

    from accel.bottleneck import read_status, watch_frame

    redraw = sys.stdout.isatty() and not args.json
    old, at, shown = None, time.monotonic(), 0
    while args.count is None or shown < args.count:
        try:
            new = read_status(args.metrics)
        except OSError:
            if old is None:
                raise
            print(f"{args.metrics} stopped answering: the job has ended")
            return 0
        now = time.monotonic()
        if args.json:
            line = json.dumps({k: v for k, v in new.items() if k != "text"})
            if args.json == "-":
                print(line, flush=True)
            else:
                with open(args.json, "a") as out:
                    out.write(line + "\n")
        else:
            frame = watch_frame(old, new, now - at)
            print(("\033[H\033[2J" if redraw else "") + f"{time.strftime('%H:%M:%S')}  {args.metrics}\n{frame}\n",
                  flush=True)
        old, at, shown = new, now, shown + 1
        if args.count is None or shown < args.count:
            time.sleep(args.interval)
    return 0


COMMANDS = {"sweep": _cmd_sweep, "calibrate": _cmd_calibrate, "plan": _cmd_plan, "status": _cmd_status}
