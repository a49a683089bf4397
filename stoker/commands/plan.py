"""`stoker plan`: cores, hosts, time-to-train and performance per dollar, and `--check` in the lab."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from stoker.commands.common import DEFAULT_CALIBRATION, PRICE, transform_options
from stoker.flags import POSITIVE, SECONDS, float_in
from stoker.options import emit_json, json_option
from stoker.protos.errors import ConfigError


def add_parser(sub) -> None:
    plan = sub.add_parser("plan", help="cores, hosts, time-to-train and performance per dollar for a system")
    plan.add_argument("--system", help="ipu-pod16, ipu-pod64, dgx-a100, a100, h100, h200, b200 (default dgx-a100; "
                                       "--dataset tokens: h100)")
    plan.add_argument("--compare", help="comma-separated systems, e.g. ipu-pod16,dgx-a100 (last is the baseline)")
    plan.add_argument("--dataset", choices=("imagenet", "wikipedia", "both", "tokens"),
                      help="default both; imagenet alone with --transform; tokens: a language model's token stream "
                           "(systems h100, h200, b200: Llama 3.1 8B pretraining in tokens/s)")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--calibration", type=Path, help=f"from `stoker calibrate` (default {DEFAULT_CALIBRATION})")
    source.add_argument("--sweep", type=Path, nargs="+", help="sweep folders: per-core rates from their host-bound "
                                                              "points")
    plan.add_argument("--per-core-rate", type=SECONDS, help="samples/s per host core (overrides both)")
    transform_options(plan, None, dest="plan_transform")  # not imported: the plan may be made off the worker hosts
    plan.add_argument("--stall-target", type=float_in(0.0, 1.0, low_open=False), default=0.02,
                      help="the share of the time the accelerator may wait for data (default %(default)s)")
    plan.add_argument("--cores-per-host", type=POSITIVE, default=64, help="cores of each host server "
                                                                          "(default %(default)s)")
    plan.add_argument("--host-price", type=PRICE, help="US$ per host server (default 25,000: an assumption)")
    plan.add_argument("--accel-price", type=PRICE, help="US$ for the system (default: its list price, if known)")
    plan.add_argument("--samples", type=SECONDS, help="samples to train (default: MLPerf's, see stoker/planning.py)")
    plan.add_argument("--pack", action="store_true",
                      help="wikipedia: BERT with packed rows (the calibration's packed rate; --check runs --pack)")
    tokens = plan.add_argument_group("--dataset tokens: cores and storage in tokens")
    tokens.add_argument("--accelerators", type=POSITIVE,
                        help="the plan answers for one system and for this many (default 8)")
    tokens.add_argument("--storage-mbps", type=SECONDS, metavar="MB/S",
                        help="MB/s (10^6 bytes) the job's store gives all its hosts together: the plan says when "
                             "storage, not CPU, is the limit (default: not limited)")
    check = plan.add_argument_group("--check: run the prediction in the lab (root, namespaces and CPU quotas)")
    check.add_argument("--check", action="store_true",
                       help="run the job on one lab host with exactly the cores the plan's rate says, then 80%% of "
                            "them, and report the measured stall beside the predicted one (one dataset, one system)")
    check.add_argument("--check-cores", type=SECONDS,
                       help="the cores K the lab host gets (default 1 for imagenet, 0.5 for wikipedia)")
    check.add_argument("--check-seconds", type=SECONDS, default=20.0, help="steady seconds per point (default 20)")
    check.add_argument("--data", help="--check: the manifest to run on (default: the dataset's generated set); "
                                      "--dataset tokens: the token set whose bytes per token the job reads "
                                      "(default: the calibration's)")
    json_option(plan, "the plans")
    plan.set_defaults(samples_per_row=None)  # set from the calibration's packed entry


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
    if args.dataset in ("wikipedia", "tokens"):
        raise ConfigError("--transform names an image transform: plan --dataset imagenet (or both)")
    return ("imagenet", "wikipedia") if args.dataset == "both" else ("imagenet",)


MIN_CHECK_CORES = 0.01  # a CFS quota of 1 ms per 100 ms period, the kernel's least


def _check_flags(args: argparse.Namespace, datasets: tuple[str, ...]) -> None:
    """What --check and --pack cannot do, refused before anything runs."""
    tokens = datasets == ("tokens",)
    if tokens and (args.check or args.sweep):
        raise ConfigError("--dataset tokens plans from `stoker calibrate` or --per-core-rate in tokens: leave out "
                          "--check and --sweep")
    if not tokens and (args.storage_mbps is not None or args.accelerators is not None):
        raise ConfigError("--storage-mbps and --accelerators plan a token stream: give --dataset tokens")
    if args.pack and "wikipedia" not in datasets:
        raise ConfigError("--pack packs BERT rows: plan --dataset wikipedia")
    if not args.check:
        if args.check_cores or (args.data and not tokens):
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


def run(args: argparse.Namespace) -> int:
    from stoker.planning import DEFAULT_HOST_PRICE, PlanInput, compare, decode_note, describe, make_plan

    datasets = _plan_datasets(args)
    _check_flags(args, datasets)
    if datasets == ("tokens",):
        return _plan_tokens(args)
    rates = {d: args.per_core_rate for d in datasets} if args.per_core_rate else _per_core_rates(args, datasets)
    systems = args.compare.split(",") if args.compare else [args.system or "dgx-a100"]
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


def _no_tokens_rate(path: Path, data: str | None) -> str:
    """What to run when the calibration has no tokens rate (or is not there): the command for this data."""
    where = "has no tokens rate" if path.exists() else "does not exist, so it has no tokens rate"
    out = "" if path == DEFAULT_CALIBRATION else f" --out {path}"
    on = f"--tokens {data}" if data else "--tokens MANIFEST"
    what = "on the token set you plan for" if data else "on your token set (`stoker prepare tokens`' manifest)"
    return (f"{path} {where}: run `stoker calibrate {on}{out}` to measure it {what}, or `stoker calibrate{out}` for "
            f"every kind (tokens on the shipped Bible); or pass --per-core-rate in tokens per CPU-second")


def _plan_tokens(args: argparse.Namespace) -> int:
    """--dataset tokens: each system's plan in tokens, from the calibration's `tokens` entry or --per-core-rate."""
    from stoker.calibrate import TOKENIZE, TOKENS, calibration_notes, checked_rate, load
    from stoker.pipeline.store.shards import Manifest
    from stoker.pipeline.text.token_cost import INT32_BYTES, bytes_per_token
    from stoker.token_planning import TokenPlanInput, describe_tokens, make_token_plan

    path = args.calibration or DEFAULT_CALIBRATION
    data = load(path) if args.calibration or not args.per_core_rate else {}
    if not args.per_core_rate and TOKENS not in data:
        raise ConfigError(_no_tokens_rate(path, args.data))
    found = data.get(TOKENS)
    entry: dict = found if isinstance(found, dict) else {}
    rate = args.per_core_rate or checked_rate(entry, TOKENS, str(path))
    for line in calibration_notes(entry, data, str(path)) if entry else ():
        print(f"note: {line}")
    measured = entry.get("bytes_per_token")
    per_token = bytes_per_token(Manifest.load(args.data)) if args.data else measured
    if isinstance(per_token, bool) or not isinstance(per_token, int | float) or not 0 < per_token < math.inf:
        per_token = INT32_BYTES
        print(f"note: no token set measured: {INT32_BYTES} bytes per token (int32, before Parquet and LZ4); give "
              "--data MANIFEST for your shards' own")
    tokenize = data.get(TOKENIZE)
    out = []
    for system in args.compare.split(",") if args.compare else [args.system or "h100"]:
        plan = make_token_plan(TokenPlanInput(
            system=system, per_core_rate=rate, bytes_per_token=per_token, accelerators=args.accelerators or 8,
            stall_target=args.stall_target, storage_mbps=args.storage_mbps,
            tokenize_rate=checked_rate(tokenize, TOKENIZE, str(path)) if isinstance(tokenize, dict) else None,
            online=entry.get("online") is True))
        print(describe_tokens(plan))
        out.append(plan.as_dict())
    emit_json(args.json, out, "plans")
    return 0
