"""What several commands share: the accelerator a job steps with, its exit code, and the job checks."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stoker import configured, options
from stoker.flags import POSITIVE, SECONDS, float_in
from stoker.pipeline.kinds import ModelFamily, kind_of

if TYPE_CHECKING:
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.accel.control.fleet_seat import FleetSeat
    from stoker.accel.summary import Summary

DEFAULT_CALIBRATION = Path("stoker-calibration.json")
PRICE = float_in(0.0, low_open=False)


def floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0."""
    return tuple(SECONDS(v) for v in text.split(",") if v)


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1."""
    return tuple(POSITIVE(v) for v in text.split(",") if v)


def transform_options(parser: argparse.ArgumentParser, default: str | None, dest: str = "transform") -> None:
    """--transform and --transform-params, named as a job names them (stoker/options.py)."""
    parser.add_argument("--transform", dest=dest, default=default, metavar="NAME",
                        help="image transform: train (MLPerf crop at 224, the default), eval, a `stoker.transforms` "
                             "entry point or package.module:name (docs/transforms.md)")
    parser.add_argument("--transform-params", dest=f"{dest}_params", default="", metavar="JSON",
                        help="keyword arguments of a transform of your own, as a JSON object")


# `stoker run`'s device: an A100, at the share of its rate the dataset kind's small_scale.run gives
RUN_PROFILE = "a100"


def default_lr(args: argparse.Namespace) -> float:
    """--lr when not given: 1e-4 for BERT's AdamW, 1e-3 for the tiny GPT's (--model gpt-*, or a tokens job's
    --data), 0.1 for ResNet's SGD."""
    if args.model.startswith("bert"):
        return 1e-4
    if args.model.startswith("gpt"):
        return 1e-3
    if args.accel == "torch" and getattr(args, "data", None):
        return 1e-3 if kind_of(options.dataset(args, args.data)).model_family == ModelFamily.GPT else 0.1
    return 0.1


def accel_spec(args: argparse.Namespace):
    from stoker.accel.backends.accelerators import AccelSpec

    if args.accel == "torch":  # the loss every few steps is what a person training wants to see
        logging.getLogger("stoker.loss").setLevel(logging.INFO)
    lr = args.lr if args.lr is not None else default_lr(args)
    kind, profile, scale = args.accel, args.profile, args.scale
    if kind is None and args.command == "run" and args.rate is None:  # a device that computes: the default job
        kind, profile = "simulated", profile or RUN_PROFILE
        scale = scale if scale is not None else kind_of(options.dataset(args, args.data)).small_scale.run
    kind = kind or ("simulated" if args.rate or profile else "null")
    return configured.config_of(AccelSpec, args, kind=kind, rate=args.rate, profile=profile, scale=scale or 1.0,
                                lr=lr, optimizer=args.optimizer or "")


def with_fleet_start(cfg: ConsumerConfig, args: argparse.Namespace, spec, ranks: int) -> ConsumerConfig:
    """With --fleet and no --fleet-start-cores: the planner's estimate, where this machine knows one."""
    if not cfg.seat.fleet or cfg.seat.start_cores is not None or cfg.dispatcher:
        return cfg
    from stoker.fleet_estimate import start_cores

    start = start_cores(spec, options.dataset(args, args.data), args.transform or "train",
                        args.transform_params or "", ranks, bool(getattr(args, "pack", False)), DEFAULT_CALIBRATION)
    return replace(cfg, seat=replace(cfg.seat, start_cores=start))


def exit_code_of(summaries: Summary | list[Summary]) -> int:
    """130 when Ctrl-C ended the job (its summary is printed); 2, with the line, when every sample was
    skipped; else 0."""
    from stoker.embedded import nothing_delivered

    first = summaries if not isinstance(summaries, list) else summaries[0]
    if first.interrupted:
        print("stoker: interrupted", file=sys.stderr)
        return 130
    failure = nothing_delivered(summaries)
    if failure:
        print(f"stoker: error: {failure}", file=sys.stderr)
        return 2
    return 0


def transform_named(name: str, params: str) -> str:
    """The transform as the closing line names it: with its parameters, when it has any."""
    return f"{name} {params}" if params else name


def is_ranked(args: argparse.Namespace) -> bool:
    """`stoker train` as a rank other than 0 (--rank, else $RANK)."""
    return bool(args.rank or os.environ.get("RANK", "0") not in ("", "0"))


def check_job(parser: argparse.ArgumentParser, args: argparse.Namespace, ranked: bool = False) -> None:
    """The job options of run, train and dispatch that cannot work together, refused before anything starts.
    Each rule is its config's own check (`JobConfig`, the fleet seat's `FleetSeat`, the stall's
    `stall_problem`), its words turned into the flag's by the option table (`configured.as_flag_problem`)."""
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.accel.control.dispatch_config import DispatchConfig, stall_problem
    from stoker.pipeline.job import JobConfig
    from stoker.protos.errors import ConfigError

    command = args.command
    if args.dataset:  # the flags one kind of dataset cannot use: the rest are checked as the job is made
        try:
            JobConfig(manifest_uri="", dataset=args.dataset, drop_last=args.drop_last,
                      corrupt_jpegs=args.corrupt_jpegs)
        except ConfigError as exc:
            parser.error(f"{command}: {configured.as_flag_problem(JobConfig, str(exc))}")
    seat = DispatchConfig if command == "dispatch" else ConsumerConfig
    checked_seat(parser, args)
    bad = _seat_problem(args, ranked) or stall_problem(args.stall_report_s, args.stall_timeout_s)
    if bad:
        parser.error(f"{command}: {configured.as_flag_problem(seat, bad)}")
    if command == "run":
        args.shard_cache_gb = options.shard_cache_gb(parser, args)
    bad = options.transform_error(args.transform, args.transform_params, args.image_size, args.crop_area,
                                  args.decode_on) or options.image_fit_error(args)
    if bad:
        parser.error(f"{command}: {bad}")


def checked_seat(parser: argparse.ArgumentParser, args: argparse.Namespace) -> FleetSeat:
    """The job's fleet seat its options make, checked as it is made (its one check: `FleetSeat`); what it
    refuses is said as the flag of the field it names."""
    from stoker.accel.control.fleet_seat import FleetSeat, SeatError

    try:
        return configured.config_of(FleetSeat, args)
    except SeatError as exc:
        parser.error(f"{args.command}: {configured.as_flag_problem(FleetSeat, str(exc))}")


def _seat_problem(args: argparse.Namespace, ranked: bool) -> str | None:
    """Who registers a job with a fleet: whoever runs the job's dispatcher (rank 0, or `stoker dispatch`);
    a keyed fleet needs the job's keys."""
    if args.fleet_key_name != "job" and not (args.fleet and getattr(args, "keys", None)):
        return "fleet_key_name: the job's key at a keyed fleet: give --fleet and --keys too"
    if args.fleet and args.command == "train" and (ranked or args.dispatcher):
        return ("fleet: the job registers where its dispatcher runs (rank 0, or `stoker dispatch --fleet`); a rank "
                "attached to it measures and says so with its acks")
    return None


def check_loopback(parser: argparse.ArgumentParser, args: argparse.Namespace, binds: dict[str, str]) -> None:
    """Without keys (and without --insecure), every address a command listens on stays on loopback: the
    configs' own rule (`exposure_problem`), its field said as the flag; `binds`: flag -> the address given."""
    from stoker.protos.exposure import exposure_problem

    flags = {flag.removeprefix("--").replace("-", "_"): flag for flag in binds}
    bad = exposure_problem({name: binds[flag] for name, flag in flags.items()}, bool(args.keys), args.insecure,
                           fix="pass --keys DIR, or --insecure on a trusted network")
    if bad:
        name, why = bad.split(": ", 1)
        parser.error(f"{args.command}: argument {flags[name]}: {why}")


def check_transform(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """sweep and calibrate: a --transform that cannot make a job, refused as a job's is."""
    bad = options.transform_error(args.transform, args.transform_params)
    if bad:
        parser.error(f"{args.command}: {bad}")
