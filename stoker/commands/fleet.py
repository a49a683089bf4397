"""`stoker fleet`: one pool of worker hosts shared between jobs."""

from __future__ import annotations

import argparse

from stoker import configured
from stoker.commands.common import check_loopback


def add_parser(sub) -> None:
    """`stoker fleet`: one pool of worker hosts for many jobs."""
    from stoker.accel.fleet.config import FleetConfig

    fleet = sub.add_parser("fleet", help="share worker hosts between jobs, by each job's live demand and weight")
    configured.add_options(fleet.add_argument_group("fleet"), FleetConfig)


def run(args: argparse.Namespace) -> int:
    from stoker.accel.fleet.config import FleetConfig
    from stoker.accel.fleet.service import FleetService

    service = FleetService(configured.config_of(FleetConfig, args))

    def ready(bound: FleetService) -> None:  # said once bound: port 0 is a free port, known only now
        metrics = f"; metrics on :{bound.metrics_port}" if bound.metrics_port else ""
        print(f"stoker fleet: hosts (stoker worker --fleet) and jobs (--fleet) register at {bound.endpoint}{metrics}",
              flush=True)

    service.run(on_ready=ready)
    return 0


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_loopback(parser, args, {"--metrics-addr": args.metrics_addr, "--bind": args.bind})
