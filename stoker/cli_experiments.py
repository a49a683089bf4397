"""The ratio-experiment commands: `stoker sweep`, `stoker calibrate`, `stoker plan`, `stoker status`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from stoker.flags import POSITIVE, SECONDS, float_in
from stoker.options import emit_json, json_option
from stoker.protos.errors import ConfigError

DEFAULT_CALIBRATION = Path("stoker-calibration.json")
PRICE = float_in(0.0, low_open=False)


def _floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0."""
    return tuple(SECONDS(v) for v in text.split(",") if v)


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1."""
    return tuple(POSITIVE(v) for v in text.split(",") if v)


def _transform_options(parser: argparse.ArgumentParser, default: str | None, dest: str = "transform") -> None:
    """--transform and --transform-params, named as a job names them (stoker/options.py)."""
    parser.add_argument("--transform", dest=dest, default=default, metavar="NAME",
                        help="image transform: train (MLPerf crop at 224, the default), eval, a `stoker.transforms` "
                             "entry point or package.module:name (docs/transforms.md)")
    parser.add_argument("--transform-params", dest=f"{dest}_params", default="", metavar="JSON",
                        help="keyword arguments of a transform of your own, as a JSON object")


def add_parsers(sub) -> None:
    """sweep, calibrate, plan and status: the commands that measure and size."""
    _add_sweep(sub)
    _add_calibrate(sub)
    _add_plan(sub)
    _add_status(sub)


def _add_sweep(sub) -> None:
    sweep = sub.add_parser("sweep", help="the CPU:accelerator ratio experiment on the emulated cluster")
    sweep.add_argument("--dataset", choices=("imagenet", "wikipedia"), default="imagenet",
                       help="the data set to sweep (default %(default)s)")
    sweep.add_argument("--hosts", type=_ints, default=(1, 2, 3, 4), help="comma-separated (default 1,2,3,4)")
    sweep.add_argument("--cores-per-host", type=_floats, default=(),
                       help="comma-separated CPU quotas (default 0.25,0.5 for imagenet, 0.05,0.1,0.2 for wikipedia)")
    sweep.add_argument("--procs", type=_ints, default=(1,), help="worker processes per host, comma-separated")
    sweep.add_argument("--profile", default="ipu-pod16", help="simulated accelerator (default ipu-pod16)")
    sweep.add_argument("--scale", type=SECONDS, help="shrink the profile (default 0.03 imagenet, 1.0 wikipedia)")
    sweep.add_argument("--seconds", type=SECONDS, default=10.0, help="steady measurement per point (default 10)")
    sweep.add_argument("--data", help="manifest (default: the dataset's generated/fetched set)")
    sweep.add_argument("--out", type=Path, help="results folder (default sweeps/DATASET, sweeps/imagenet-TRANSFORM for "
                                                "another transform); rerun to resume")
    sweep.add_argument("--loopback", action="store_true", help="no namespaces (no CPU quotas without root)")
    sweep.add_argument("--ranks", type=POSITIVE, default=1,
                       help="feed the system as this many data-parallel ranks, each 1/ranks of its rate (default 1)")
    _transform_options(sweep, "train")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("train_args", nargs=argparse.REMAINDER,
                       help="after --: more `stoker train` options; `-- --accel torch --model resnet18 "
                            "--image-size 112` sweeps against a real step instead of the profile")


def _add_calibrate(sub) -> None:
    cal = sub.add_parser("calibrate", help="per-core supply rates of this machine (under a minute)")
    cal.add_argument("--seconds", type=SECONDS, default=15.0, help="per dataset (default 15)")
    cal.add_argument("--out", type=Path, default=DEFAULT_CALIBRATION,
                     help="the calibration file; a measurement replaces only its own rates in it (default %(default)s)")
    _transform_options(cal, None)
    cal.add_argument("--data", help="--transform: the image manifest to measure on (default: the generated set)")


def _add_plan(sub) -> None:
    plan = sub.add_parser("plan", help="cores, hosts, time-to-train and performance per dollar for a system")
    plan.add_argument("--system", default="dgx-a100", help="ipu-pod16, ipu-pod64, dgx-a100, a100, h100, h200, b200")
    plan.add_argument("--compare", help="comma-separated systems, e.g. ipu-pod16,dgx-a100 (last is the baseline)")
    plan.add_argument("--dataset", choices=("imagenet", "wikipedia", "both"),
                      help="default both; imagenet alone with --transform")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--calibration", type=Path, help=f"from `stoker calibrate` (default {DEFAULT_CALIBRATION})")
    source.add_argument("--sweep", type=Path, nargs="+", help="sweep folders: per-core rates from their host-bound "
                                                              "points")
    plan.add_argument("--per-core-rate", type=SECONDS, help="samples/s per host core (overrides both)")
    _transform_options(plan, None, dest="plan_transform")  # not imported: the plan may be made off the worker hosts
    plan.add_argument("--stall-target", type=float_in(0.0, 1.0, low_open=False), default=0.02,
                      help="the share of the time the accelerator may wait for data (default %(default)s)")
    plan.add_argument("--cores-per-host", type=POSITIVE, default=64, help="cores of each host server "
                                                                          "(default %(default)s)")
    plan.add_argument("--host-price", type=PRICE, help="US$ per host server (default 25,000: an assumption)")
    plan.add_argument("--accel-price", type=PRICE, help="US$ for the system (default: its list price, if known)")
    plan.add_argument("--samples", type=SECONDS, help="samples to train (default: MLPerf's, see stoker/planning.py)")
    plan.add_argument("--pack", action="store_true",
                      help="wikipedia: BERT with packed rows (the calibration's packed rate; --check runs --pack)")
    check = plan.add_argument_group("--check: run the prediction in the lab (root, namespaces and CPU quotas)")
    check.add_argument("--check", action="store_true",
                       help="run the job on one lab host with exactly the cores the plan's rate says, then 80%% of "
                            "them, and report the measured stall beside the predicted one (one dataset, one system)")
    check.add_argument("--check-cores", type=SECONDS,
                       help="the cores K the lab host gets (default 1 for imagenet, 0.5 for wikipedia)")
    check.add_argument("--check-seconds", type=SECONDS, default=20.0, help="steady seconds per point (default 20)")
    check.add_argument("--data", help="--check: the manifest to run on (default: the dataset's generated set)")
    json_option(plan, "the plans")
    plan.set_defaults(samples_per_row=None)  # set from the calibration's packed entry


def _add_status(sub) -> None:
    status = sub.add_parser("status", help="what bounds a running job's throughput, from its consumer's metrics "
                                           "(or a fleet's jobs, from the fleet's)")
    status.add_argument("--metrics", default="http://127.0.0.1:9560/metrics",
                        help="the consumer's /metrics URL, or a fleet's (stoker fleet: port 9558): each job's "
                             "processes, need, stall and share")
    json_option(status, "the figures (with --watch: one line per refresh)")
    status.add_argument("--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float_in(0.1), default=1.0, help="--watch: seconds between refreshes")
    status.add_argument("--count", type=POSITIVE, help="--watch: stop after this many refreshes")


def _cmd_sweep(args: argparse.Namespace) -> int:
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


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from stoker.calibrate import PACKED, calibrate, calibrate_transform, rate_text, writable
    from stoker.datasets import default_imagenet, default_wikipedia

    writable(args.out)  # before the data sets are made and minutes are measured, not after
    if args.transform is not None:
        r = calibrate_transform(args.data or str(default_imagenet()), args.transform, args.transform_params,
                                args.seconds, args.out)
        print(f"{args.transform}: {rate_text(r)} ({r['what']}; {r['version']})")
        print(f"written to {args.out}")
        return 0
    result = calibrate(str(default_imagenet()), str(default_wikipedia()), args.seconds, args.out)
    for name in ("imagenet", "wikipedia", PACKED):
        r = result[name]
        print(f"{name}: {rate_text(r)} ({r['what']})")
    print(f"written to {args.out}")
    return 0


def _per_core_rates(args: argparse.Namespace, datasets: tuple[str, ...]) -> dict[str, float]:
    """Each dataset's rate from the sweeps or the calibration; images at the --transform asked for."""
    from stoker.calibrate import PACKED, calibration_notes, checked_rate, load, rate_text, transform_rate
    from stoker.sweep import load_points, per_core_rate

    if args.sweep:
        rates = {}
        for folder in args.sweep:
            points = load_points(folder)
            if not points:
                raise ConfigError(f"{folder}: no sweep points (points.jsonl) there")
            rate = per_core_rate(points)
            if rate is None:
                raise ConfigError(f"{folder}: no host-bound point (stall > 10%) to read a per-core rate from")
            swept = points[0].transform_named
            if points[0].dataset == "imagenet" and swept != _asked(args):
                raise ConfigError(f"{folder} swept transform {swept}, not {_asked(args)}: plan with --transform "
                                 f"{points[0].transform}, or sweep the one you mean with `stoker sweep --transform`")
            rates[points[0].dataset] = rate  # rows/s per core: the scale shrinks the device, not the cores
        return rates
    path = args.calibration or DEFAULT_CALIBRATION
    if not path.exists():
        raise ConfigError(f"{path} does not exist: run `stoker calibrate` first, or pass --sweep DIR or "
                          "--per-core-rate")
    data, rates = load(path), {}
    for dataset in datasets:
        name = dataset
        if dataset == "imagenet":
            entry = transform_rate(data, args.plan_transform or "train", args.plan_transform_params, str(path))
            if args.plan_transform:
                print(f"transform {_asked(args)}: {rate_text(entry)}, calibrated with "
                      f"{entry.get('version', 'an unrecorded version')} on {entry.get('when', '?')}")
        else:
            name = PACKED if args.pack else dataset
            if name not in data:
                raise ConfigError(f"{path} has no {name} rate: run `stoker calibrate` (both datasets, packed and "
                                 "not), or pass --per-core-rate")
            entry = data[name]
            args.samples_per_row = entry.get("sequences_per_row", 1.0)
        rates[dataset] = checked_rate(entry, name if dataset != "imagenet" else _asked(args), str(path))
        for line in calibration_notes(entry, data, str(path)):
            print(f"note: {line}")
    return rates


def _asked(args: argparse.Namespace) -> str:
    from stoker.planning import transform_key

    return transform_key(args.plan_transform or "train", args.plan_transform_params)


def _plan_datasets(args: argparse.Namespace) -> tuple[str, ...]:
    """--dataset, where a --transform (an image transform) means imagenet unless both are asked for."""
    from stoker.pipeline.transforms import check_name, parse_params

    if args.plan_transform is None:
        return ("imagenet", "wikipedia") if args.dataset in (None, "both") else (args.dataset,)
    check_name(args.plan_transform)
    parse_params(args.plan_transform_params)
    if args.dataset == "wikipedia":
        raise ConfigError("--transform names an image transform: plan --dataset imagenet (or both)")
    return ("imagenet", "wikipedia") if args.dataset == "both" else ("imagenet",)


MIN_CHECK_CORES = 0.01  # a CFS quota of 1 ms per 100 ms period, the kernel's least


def _check_flags(args: argparse.Namespace, datasets: tuple[str, ...]) -> None:
    """What --check and --pack cannot do, refused before anything runs."""
    if args.pack and "wikipedia" not in datasets:
        raise ConfigError("--pack packs BERT rows: plan --dataset wikipedia")
    if not args.check:
        if args.check_cores or args.data:
            raise ConfigError("--check-cores and --data belong to --check")
        return
    if len(datasets) != 1:
        raise ConfigError("--check runs one job: give --dataset imagenet or --dataset wikipedia")
    if args.compare:
        raise ConfigError("--check checks the per-core rate, the same for every system: leave out --compare")
    if args.check_cores is not None:
        free = (os.cpu_count() or 1) - 1  # the lab's consumer and simulated device run beside the host under test
        if not MIN_CHECK_CORES <= args.check_cores <= free:
            raise ConfigError(f"--check-cores {args.check_cores:g}: the lab can give a host {MIN_CHECK_CORES:g} to "
                             f"{free} core(s) here ({os.cpu_count()} cores, one kept for the consumer)")


def _cmd_plan(args: argparse.Namespace) -> int:
    from stoker.planning import DEFAULT_HOST_PRICE, PlanInput, compare, decode_note, describe, make_plan

    datasets = _plan_datasets(args)
    _check_flags(args, datasets)
    rates = {d: args.per_core_rate for d in datasets} if args.per_core_rate else _per_core_rates(args, datasets)
    systems = args.compare.split(",") if args.compare else [args.system]
    out = []
    for dataset in datasets:
        if dataset not in rates:
            raise ConfigError(f"no per-core rate for {dataset}: sweep it too, or pass --per-core-rate")
        transform = _asked(args) if dataset == "imagenet" else ""
        plans = [make_plan(PlanInput(system=s, dataset=dataset, per_core_rate=rates[dataset],
                                     stall_target=args.stall_target, cores_per_host=args.cores_per_host,
                                     host_price=args.host_price or DEFAULT_HOST_PRICE, accel_price=args.accel_price,
                                     samples=args.samples, transform=transform)) for s in systems]
        for plan in plans:
            print(describe(plan))
            if dataset == "imagenet":
                print(f"  decode on the accelerator: {decode_note(plan.system)}")
        if len(plans) > 1:
            print(compare(plans))
        out += [p.as_dict() for p in plans]
    if args.check:
        checked = _check(args, datasets[0], rates[datasets[0]])
        out = [{**plan, "check": checked} for plan in out]
    emit_json(args.json, out, "plans")
    return 0


def _check(args: argparse.Namespace, dataset: str, rate: float) -> dict:
    from stoker.datasets import default_manifest
    from stoker.plan_check import CheckConfig, describe, run_check

    spr = 1.0
    if dataset == "wikipedia" and args.pack:
        if args.samples_per_row is None:
            raise ConfigError("--check --pack takes the sequences per row from the calibration's packed rate: "
                             "plan from `stoker calibrate`'s file, not --per-core-rate or --sweep")
        spr = args.samples_per_row
    cfg = CheckConfig(dataset=dataset, per_core_rate=rate, data=args.data or str(default_manifest(dataset)),
                      stall_target=args.stall_target, cores=args.check_cores, seconds=args.check_seconds,
                      samples_per_row=spr, transform=args.plan_transform or "train",
                      transform_params=args.plan_transform_params,
                      train_args=("--pack",) if args.pack and dataset == "wikipedia" else ())
    result = run_check(cfg)
    print(describe(result))
    return result.as_dict()


def _cmd_status(args: argparse.Namespace) -> int:
    from stoker.accel.bottleneck import read_status

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

    from stoker.accel.bottleneck import read_status, watch_frame

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
            frame = watch_frame(old, new, now - at, args.metrics)  # its first line: whose job, at which URL
            print(("\033[H\033[2J" if redraw else "") + f"{time.strftime('%H:%M:%S')}  {frame}\n", flush=True)
        old, at, shown = new, now, shown + 1
        if args.count is None or shown < args.count:
            time.sleep(args.interval)
    return 0


COMMANDS = {"sweep": _cmd_sweep, "calibrate": _cmd_calibrate, "plan": _cmd_plan, "status": _cmd_status}
