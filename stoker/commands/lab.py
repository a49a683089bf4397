"""`stoker lab`: the emulated cluster on this machine."""

from __future__ import annotations

import argparse
import json

from stoker.flags import POSITIVE, SECONDS
from stoker.protos.errors import ConfigError


def add_parser(sub) -> None:
    """`stoker lab`: the emulated cluster."""
    lab = sub.add_parser("lab", help="an emulated cluster on this machine (network namespaces, CPU quotas)")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    up = lab_sub.add_parser("up", help="make the hosts and start a consumer and one worker daemon per host")
    up.add_argument("--hosts", type=POSITIVE, default=3, help="emulated worker hosts (default %(default)s)")
    up.add_argument("--cores-per-host", type=SECONDS, default=1.0, help="CPU quota of each host (default 1)")
    up.add_argument("--procs", type=POSITIVE, default=1, help="worker processes per host")
    up.add_argument("--link-gbit", type=SECONDS, help="shape each host's link to this rate")
    up.add_argument("--link-latency-ms", type=SECONDS, help="add this one-way latency to each host's link")
    up.add_argument("--loopback", action="store_true", help="no namespaces: everything on 127.0.0.1")
    up.add_argument("--ranks", type=POSITIVE, default=1,
                    help="consumer ranks (data-parallel), all on the accelerator (default 1)")
    up.add_argument("--fleet", action="store_true",
                    help="run a `stoker fleet` instead of a consumer, its hosts serving it; start jobs with "
                         "`stoker lab job`")
    up.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="after --: options for the consumer's `stoker train` (default data: the generated set)")
    lab_sub.add_parser("status", help="what the lab is made of and whether its processes live")
    wait = lab_sub.add_parser("wait", help="wait for the job (a fleet's lab: the job named) to finish and print its "
                                           "summary")
    wait.add_argument("job", nargs="?", help="a fleet's lab: the job to wait for (job0 .. job7)")
    job = lab_sub.add_parser("job", help="a fleet's lab: start a job registered with its fleet")
    job.add_argument("name", help="job0 .. job7: its key and its ports")
    job.add_argument("train_args", nargs=argparse.REMAINDER,
                     help="after --: options for its `stoker train` (--weight, --min-cores, --max-cores, the job's; "
                          "default data: the generated set)")
    lab_sub.add_parser("down", help="stop everything and remove what the lab made (safe to repeat)")
    for name, text in (("kill", "kill -9 a host's whole daemon"), ("cut", "drop every packet on a host's link"),
                       ("heal", "undo cut")):
        op = lab_sub.add_parser(name, help=text)
        op.add_argument("host", help="h0, h1, ...")


def run(args: argparse.Namespace) -> int:
    from stoker.lab import cluster

    command = args.lab_command
    if command == "up":
        if args.fleet and (args.ranks != 1 or [a for a in args.train_args if a != "--"]):
            raise ConfigError("lab up --fleet: the fleet's jobs come later, with their options (stoker lab job NAME "
                              "-- TRAIN OPTIONS); --ranks and train options are not the fleet's")
        state = _lab_up(args)
        _print_lab(state)
    elif command == "job":
        from stoker.lab.fleet_lab import start_job

        member = start_job(args.name, _with_default_data([a for a in args.train_args if a != "--"]))
        print(f"job {args.name}: pid {member.pid}, metrics {member.metrics}, log {member.log}")
    elif command == "status":
        _print_lab(cluster.current())
    elif command == "wait":
        from stoker.lab.fleet_lab import job_summary

        print(json.dumps(job_summary(args.job) if args.job else cluster.wait(), indent=1))
    elif command == "down":
        removed = cluster.down()
        print("removed: " + (", ".join(removed) if removed else "nothing (no lab was up)"))
    else:
        {"kill": cluster.kill_host, "cut": cluster.cut, "heal": cluster.heal}[command](args.host)
        print(f"{command}: {args.host}")
    return 0


def _with_default_data(train_args: list[str]) -> list[str]:
    """The generated default set of the job's dataset, where the options name no --data."""
    if "--data" in train_args or any(a.startswith("--data=") for a in train_args):
        return train_args
    from stoker.datasets import default_manifest

    dataset = "wikipedia" if "wikipedia" in train_args or "--dataset=wikipedia" in train_args else "imagenet"
    return [*train_args, "--data", str(default_manifest(dataset))]


def _lab_up(args: argparse.Namespace):
    from stoker.lab import cluster
    from stoker.lab.fleet_lab import FleetLab

    cfg = cluster.LabConfig(hosts=args.hosts, cores_per_host=args.cores_per_host, procs=args.procs, ranks=args.ranks,
                            link_gbit=args.link_gbit, link_latency_ms=args.link_latency_ms, loopback=args.loopback,
                            fleet=args.fleet)
    if args.fleet:
        return FleetLab(cfg).up([])
    return cluster.Lab(cfg).up(_with_default_data([a for a in args.train_args if a != "--"]))


def _print_lab(state) -> None:
    from stoker.lab.cluster import alive

    print(f"lab ({state.mode}){': ' + state.note.lstrip('; ') if state.note else ''}")
    for member in state.members.values():
        where = f"netns {member.netns}" if member.netns else "root namespace"
        print(f"  {member.name:6} {member.address:15} {where:18} pid {member.pid} "
              f"{'up' if alive(member.pid) else 'exited'}  metrics {member.metrics}  log {member.log}")
    if state.config.get("fleet"):
        print(f"hosts and jobs register with the fleet at {state.fleet_endpoint}; start a job with `stoker lab job "
              "job0 -- TRAIN OPTIONS`")
    else:
        print(f"workers connect to {state.control_endpoint}; summary will be written to {state.summary}")
