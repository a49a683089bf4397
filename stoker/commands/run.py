"""`stoker run`: the dispatcher, a consumer and worker daemons, the whole job on this machine."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from stoker import configured, options
from stoker.commands.common import (
    accel_spec,
    check_job,
    check_loopback,
    exit_code_of,
    transform_named,
    with_fleet_start,
)
from stoker.flags import METRICS_PORT, NON_NEGATIVE, int_at_least, procs
from stoker.options import ACCELERATOR, FLEET_SEAT, JOB, OUTPUT, SHARD_CACHE, consumer_metrics

if TYPE_CHECKING:
    from stoker.accel.consumer import Consumer


def add_parser(sub) -> None:
    """`stoker run`: the whole job on this machine."""
    from stoker.accel.consumer_config import ConsumerConfig

    run = sub.add_parser("run", help="dispatcher + consumer + worker daemons on this machine", parents=[
        JOB, ACCELERATOR, options.consumer_sockets(free_ports=True), options.control_socket(free_ports=True),
        consumer_metrics("the consumer's /metrics port (default 9560; 0: a free one; -1: none)"), SHARD_CACHE,
        OUTPUT, FLEET_SEAT])
    run.add_argument("--data", help="shards' manifest (default: the generated ImageNet-like set, or the "
                                    "prepared Wikipedia text with --dataset wikipedia)")
    run.add_argument("--images", type=int_at_least(10), default=2000, help="size of the generated default image set")
    run.add_argument("--hosts", type=NON_NEGATIVE, default=None, help="worker daemons, one per emulated host "
                                                                    "(default 2; with --fleet 0: the fleet's hosts "
                                                                    "serve the job)")
    run.add_argument("--procs", type=procs, default=1, help="decode processes per host (at most 4 per core, "
                     "8 on any host)")
    run.add_argument("--worker-metrics-port", type=METRICS_PORT, default=None,
                     help="host i serves on this + i (default: each a free port; -1: none)")
    options.refused(run, "--keys", "stoker run starts its worker daemons here, over loopback, without keys; for CURVE "
                                   "across hosts run `stoker train --keys DIR` and `stoker worker --keys DIR`")
    configured.add_options(run, ConsumerConfig, ("insecure",))


def run(args: argparse.Namespace) -> int:
    from stoker.embedded import RunConfig, print_summary, run_embedded, run_manifest

    spec = accel_spec(args)
    # the default /metrics port, taken by another job, is not an error for a job on one machine
    consumer = replace(options.consumer_config(args), metrics_port_or_free=args.metrics_port is None)
    consumer = with_fleet_start(consumer, args, spec, args.world_size or 1)
    worker_port = 0 if args.worker_metrics_port is None else args.worker_metrics_port  # 0: each a free port
    cfg = RunConfig(hosts=args.hosts, procs=args.procs, accel=spec, consumer=consumer,
                    worker_metrics_port=None if worker_port < 0 else worker_port,
                    progress=not args.no_progress, log_level=args.log_level,
                    shard_cache_gb=args.shard_cache_gb, record_steps=args.record_steps or "")
    endpoints: dict[str, str | None] = {}

    def started(consumer: Consumer) -> None:  # say where this job listens: its ports may be free ones
        endpoints.update(metrics=consumer.metrics_url or None, control=consumer.control_endpoint,
                         data=consumer.data_endpoint)
        print(f"stoker: job {consumer.job.job_id} on {endpoints['control']}; metrics "
              + (f"on {endpoints['metrics']} (stoker status --metrics {endpoints['metrics']})"
                 if endpoints["metrics"] else "off"), file=sys.stderr, flush=True)

    manifest = run_manifest(args.data, options.dataset(args, args.data), args.images, progress=cfg.progress)
    summaries = run_embedded(options.job_config(args, manifest_uri=manifest), cfg, on_start=started)
    print_summary(summaries, args.json, cfg.accel, transform_named(args.transform, args.transform_params),
                  endpoints=endpoints)
    return exit_code_of(summaries)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What cannot work together, refused before anything starts; `--hosts` gets its default here (2, or 0
    with --fleet: the fleet's hosts serve the job)."""
    check_job(parser, args)
    if args.fleet and args.hosts is not None:
        parser.error("run: argument --hosts: with --fleet the fleet's hosts serve the job (stoker worker --fleet "
                     "on each); this machine's own hosts would be unknown to the fleet")
    args.hosts = (0 if args.fleet else 2) if args.hosts is None else args.hosts
    if args.hosts == 0 and not args.fleet:
        parser.error("run: argument --hosts: 0 hosts would feed nothing (without --fleet)")
    if (args.worker_metrics_port or 0) > 0 and args.worker_metrics_port + args.hosts - 1 > 65535:
        parser.error(f"run: argument --worker-metrics-port: {args.hosts} hosts need ports "
                     f"{args.worker_metrics_port}-{args.worker_metrics_port + args.hosts - 1}, beyond 65535")
    check_loopback(parser, args, {"--metrics-addr": args.metrics_addr, "--data-bind": args.data_bind,
                                  "--control-bind": args.control_bind})
