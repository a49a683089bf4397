"""`stoker dispatch`: the dispatcher as its own process, with a journal."""

from __future__ import annotations

import argparse

from stoker import configured, options
from stoker.commands.common import check_job, check_loopback, checked_seat
from stoker.options import JOB
from stoker.protos.errors import StateError


def add_parser(sub) -> None:
    """`stoker dispatch`: the dispatcher alone."""
    from stoker.accel.control.dispatch_config import DispatchConfig

    dispatch = sub.add_parser("dispatch", help="the dispatcher as its own process, with a journal", parents=[JOB])
    dispatch.add_argument("--data", required=True, help="shards' manifest.json (or its folder)")
    configured.add_options(dispatch.add_argument_group("dispatcher"), DispatchConfig)


def run(args: argparse.Namespace) -> int:
    from stoker.accel.control.dispatch_config import DispatchConfig
    from stoker.accel.control.service import DispatchService

    service = DispatchService(configured.config_of(DispatchConfig, args), options.job_config(args))
    attach = f"; consumers attach with --job-secret {service.secret_file}" if service.secret_file else ""

    def ready(bound: DispatchService) -> None:  # said once bound: port 0 is a free port, known only now
        metrics = f"; metrics on :{bound.metrics_port}" if bound.metrics_port else ""
        print(f"stoker dispatch: job {bound.job.job_id}; workers and the consumer connect to {bound.endpoint}"
              f"{metrics}{attach}", flush=True)

    service.run(on_ready=ready)
    stats = service.dispatcher.stats()
    if stats.failure:
        raise StateError(f"the job failed: {stats.failure}")
    print(f"dispatcher done: {stats.done}/{service.dispatcher.total_units} units, {stats.releases} re-leased")
    return 0


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What cannot work together, refused before anything starts."""
    from stoker.accel.control.dispatch_config import DispatchConfig

    bad = configured.config_of(DispatchConfig, args, seat=checked_seat(parser, args)).problem()
    if bad:
        parser.error(f"dispatch: {configured.as_flag_problem(DispatchConfig, bad)}")
    check_job(parser, args)
    check_loopback(parser, args, {"--metrics-addr": args.metrics_addr, "--control-bind": args.control_bind})
