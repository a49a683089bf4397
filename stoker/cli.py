"""The `stoker` command: a thin layer that parses arguments and calls the packages."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stoker import __version__, cli_experiments, cli_prepare, configured, options, settings
from stoker.flags import METRICS_PORT, NON_NEGATIVE, POSITIVE, SECONDS, SEED, Parser, int_at_least, output_file, procs
from stoker.options import (
    ACCELERATOR,
    CONSUMER_SOCKETS,
    CONTROL_SOCKET,
    FLEET_SEAT,
    JOB,
    OUTPUT,
    SHARD_CACHE,
    Deprecated,
    consumer_metrics,
)
from stoker.pipeline.kinds import kind_of
from stoker.protos.errors import ConfigError, StateError, StokerError

if TYPE_CHECKING:
    from stoker.accel.consumer import Consumer
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.accel.summary import Summary


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stoker", description="Keep accelerators fed.")
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG, INFO, WARNING (default) or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data(sub)
    cli_prepare.add_parser(sub)
    _add_worker(sub)
    _add_keys(sub)
    _add_train(sub)
    _add_dispatch(sub)
    _add_fleet(sub)
    _add_run(sub)
    _add_lab(sub)
    cli_experiments.add_parsers(sub)
    return parser


def _add_data(sub) -> None:
    """`stoker data`: make or inspect datasets."""
    data = sub.add_parser("data", help="make or inspect datasets").add_subparsers(dest="data_command", required=True)
    synth = data.add_parser("imagenet-synth", help="write an ImageNet-like set made from real photos")
    synth.add_argument("dir", help="the folder to write DIR/train/<class>/*.JPEG into")
    synth.add_argument("--images", type=POSITIVE, default=2000, help="images in all (default %(default)s)")
    synth.add_argument("--classes", type=POSITIVE, default=10, help="classes, one folder each (default %(default)s)")
    synth.add_argument("--seed", type=SEED, default=0, help="the same seed writes the same set (default 0)")
    synth.add_argument("--procs", type=POSITIVE, help="processes writing images (default: one per core)")
    stats = data.add_parser("stats", help="size/format statistics of an ImageNet-layout folder")
    stats.add_argument("dir", help="an ImageNet-layout folder (DIR/train/<class>/*.JPEG or DIR/<class>/*)")
    wiki = data.add_parser("wikipedia", help="write real English Wikipedia text and BERT's vocab.txt")
    wiki.add_argument("dir", help="the folder to write the articles and vocab.txt into")
    wiki.add_argument("--docs", type=POSITIVE, help="keep only the first N articles (default: all ~10,000)")


def _add_worker(sub) -> None:
    """`stoker worker`: the per-host daemon, its options made from `WorkerConfig` (stoker.configured)
    and also read from $STOKER_* variables and a --config file (stoker.settings)."""
    from stoker.workers.worker_config import WorkerConfig

    worker = sub.add_parser("worker", help="the per-host decode/augment daemon", epilog=WORKER_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    configured.add_options(worker.add_argument_group("worker daemon"), WorkerConfig, layered=True)
    worker.add_argument("--config", metavar="FILE",
                        help="a TOML file of these options by name (procs = 4, leave-after = 5.0); a flag, then a "
                             "STOKER_* variable, beats it")
    worker.add_argument("--connect", dest="connect", action=Deprecated, instead="--dispatcher",
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    worker.add_argument("--no-metrics", dest="metrics_port", action=Deprecated, nargs=0, const=-1,
                        instead="--metrics-port -1", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


WORKER_EPILOG = """\
Every option but --parent-pid can also be set by a variable, STOKER_ and its name in upper case
(STOKER_PROCS=8, STOKER_LEAVE_AFTER=5, STOKER_INSECURE=1), or in the --config file; a flag beats
a variable, a variable beats the file, and the file beats the default."""


def _add_keys(sub) -> None:
    """`stoker keys`: CURVE keys and the allow-list."""
    keys = sub.add_parser("keys", help="CURVE keys and the allow-list of worker hosts").add_subparsers(
        dest="keys_command", required=True)
    keys_init = keys.add_parser("init", help="make the service's key pair and an empty allow-list")
    keys_init.add_argument("dir", help="the key folder to make")
    keys_add = keys.add_parser("add", help="make a key pair and allow-list it in its role")
    keys_add.add_argument("dir", help="the key folder (stoker keys init)")
    keys_add.add_argument("name", help="the host's (or consumer's) key name, its --key-name")
    keys_add.add_argument("--role", choices=("worker", "consumer", "job"), default="worker",
                          help="worker (a CPU host, default), consumer (a `stoker train --dispatcher`) or job (a job "
                               "that registers with `stoker fleet`)")
    keys_list = keys.add_parser("list", help="list the keys and the allow-list")
    keys_list.add_argument("dir", help="the key folder (stoker keys init)")


def _add_train(sub) -> None:
    """`stoker train`: a consumer rank (+ dispatcher)."""
    from stoker.accel.consumer_config import ConsumerConfig

    train = sub.add_parser("train", help="the consumer (+ dispatcher) on the accelerator host", parents=[
        JOB, ACCELERATOR, CONSUMER_SOCKETS, CONTROL_SOCKET,
        consumer_metrics("/metrics port (default 9560; rank R > 0: 9570 + R; 0: a free one; -1: none)"), OUTPUT,
        FLEET_SEAT])
    configured.add_options(train.add_argument_group("security"), ConsumerConfig, ("keys", "insecure"))
    train.add_argument("--data", help="shards' manifest.json (or its folder); not with --dispatcher")
    train.add_argument("--checkpoint", metavar="PATH", type=output_file(),  # refused now, not at the first save
                       help="write the data position (a small JSON state_dict) here, and with --accel torch "
                            "the model + optimizer to PATH.model.pt")
    train.add_argument("--checkpoint-every", type=POSITIVE, default=50, help="steps between checkpoints (default 50)")
    train.add_argument("--resume", metavar="PATH", help="continue the job from this checkpoint (the same path as "
                                                        "--checkpoint: only if it exists, as a service wants)")
    train.add_argument("--max-seconds", type=SECONDS,
                       help="stop after this many seconds past the first batch (a time-boxed measurement)")
    train.add_argument("--rank", type=NON_NEGATIVE, default=None,
                       help="this consumer's data-parallel rank (default 0, or $RANK); ranks other than 0 attach "
                            "to rank 0's dispatcher (--dispatcher, default its control port on $MASTER_ADDR)")
    configured.add_options(train, ConsumerConfig, ("credit_budget_mb",))
    configured.add_options(train.add_argument_group("attaching to a dispatcher"), ConsumerConfig, (
        "dispatcher", "job_secret", "key_name", "attach_timeout_s"))


def _add_dispatch(sub) -> None:
    """`stoker dispatch`: the dispatcher alone."""
    from stoker.accel.control.dispatch_config import DispatchConfig

    dispatch = sub.add_parser("dispatch", help="the dispatcher as its own process, with a journal", parents=[JOB])
    dispatch.add_argument("--data", required=True, help="shards' manifest.json (or its folder)")
    configured.add_options(dispatch.add_argument_group("dispatcher"), DispatchConfig)


def _add_fleet(sub) -> None:
    """`stoker fleet`: one pool of worker hosts for many jobs."""
    from stoker.accel.control.fleet_config import FleetConfig

    fleet = sub.add_parser("fleet", help="share worker hosts between jobs, by each job's live demand and weight")
    configured.add_options(fleet.add_argument_group("fleet"), FleetConfig)


def _add_run(sub) -> None:
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



def _add_lab(sub) -> None:
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


# `stoker run`'s device: an A100, at the share of its rate the dataset kind's small_scale.run gives
RUN_PROFILE = "a100"


def _accel_spec(args: argparse.Namespace):
    from stoker.accel.backends.accelerators import AccelSpec

    if args.accel == "torch":  # the loss every few steps is what a person training wants to see
        logging.getLogger("stoker.loss").setLevel(logging.INFO)
    lr = args.lr if args.lr is not None else (1e-4 if args.model.startswith("bert") else 0.1)
    kind, profile, scale = args.accel, args.profile, args.scale
    if kind is None and args.command == "run" and args.rate is None:  # a device that computes: the default job
        kind, profile = "simulated", profile or RUN_PROFILE
        scale = scale if scale is not None else kind_of(options.dataset(args, args.data)).small_scale.run
    kind = kind or ("simulated" if args.rate or profile else "null")
    return configured.config_of(AccelSpec, args, kind=kind, rate=args.rate, profile=profile, scale=scale or 1.0,
                                lr=lr, optimizer=args.optimizer or "")


def _cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "wikipedia":
        from stoker.pipeline.text.corpus import write_wikipedia

        corpus = write_wikipedia(args.dir, documents=args.docs)
        print(f"wrote {corpus.documents} Wikipedia articles to {corpus.text} and BERT's vocabulary to {corpus.vocab}\n"
              f"next: stoker prepare wikipedia {corpus.text} SHARDS_DIR --vocab {corpus.vocab}")
        return 0
    if args.data_command == "imagenet-synth":
        from stoker.pipeline.synth import SynthConfig, generate

        total = generate(args.dir, SynthConfig(images=args.images, classes=args.classes, seed=args.seed),
                         processes=args.procs)
        print(f"wrote {args.images} images ({total / 1e6:.1f} MB) to {args.dir}/train")
        return 0
    from stoker.pipeline.store.stats import folder_stats

    print(json.dumps(folder_stats(args.dir).as_dict(), indent=1))
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from stoker.workers.multiproc import ENV, prepare_multiproc_dir, remove_multiproc_dir

    ours = ENV not in os.environ
    folder = prepare_multiproc_dir()  # before prometheus_client is imported
    try:
        from stoker.workers.daemon import WorkerDaemon
        from stoker.workers.fleet_agent import FleetAgent
        from stoker.workers.worker_config import WorkerConfig

        cfg = configured.config_of(WorkerConfig, args)
        return FleetAgent(cfg).run() if cfg.fleet else WorkerDaemon(cfg).run()
    finally:
        if ours:
            remove_multiproc_dir(folder)


def _cmd_train(args: argparse.Namespace) -> int:
    from stoker.accel import checkpoint
    from stoker.accel.consumer import Consumer
    from stoker.accel.ranks import place, rank_zero_dispatcher
    from stoker.embedded import Progress, print_summary

    where = place(args.rank, args.world_size, None)
    rank, world_size = where.rank, where.world_size
    cfg = rank_zero_dispatcher(options.consumer_config(args, args.rank), rank, where.master_addr)
    job = None if cfg.dispatcher else options.job_config(args, args.rank)
    resume = None
    if args.resume and args.resume == args.checkpoint and not Path(args.resume).exists():
        print(f"stoker train: no checkpoint at {args.resume} yet; starting the job from the beginning")
    elif args.resume:
        resume = checkpoint.load(args.resume)
    spec = _accel_spec(args)
    cfg = _with_fleet_start(cfg, args, spec, world_size)
    consumer = Consumer(cfg, job, spec.factory(), resume=resume, rank=rank,
                        world_size=world_size if cfg.dispatcher and args.world_size else None)
    if args.resume and checkpoint.load_model(consumer.accelerator, args.resume):
        print(f"stoker train: model and optimizer restored from {checkpoint.model_path(args.resume)}")
    consumer.start()
    job = consumer.job
    ranks = f" (rank {rank} of {job.world_size})" if job.world_size > 1 else ""
    print(f"stoker train: job {job.job_id}{ranks}; workers connect to {consumer.control_endpoint}"
          + (f"; metrics on :{consumer.metrics_port}" if consumer.metrics_port else ""), flush=True)
    progress = Progress(job.epochs * consumer.plan.samples_per_epoch, not args.no_progress, job.dataset)
    steps = 0

    def on_step(c: Consumer) -> None:
        nonlocal steps
        progress(c)
        steps += 1
        if args.checkpoint and steps % args.checkpoint_every == 0:
            checkpoint.save_all(c, args.checkpoint, elsewhere=CHECKPOINT_ELSEWHERE)

    try:
        summary = consumer.run(on_step=on_step, max_seconds=args.max_seconds)
        progress.close(consumer)
        if args.checkpoint:
            try:  # after a Ctrl-C, a dispatcher that does not answer at once is not waited on for long
                checkpoint.save_all(consumer, args.checkpoint, INTERRUPTED_ANSWER_S if summary.interrupted else None,
                                    CHECKPOINT_ELSEWHERE)
            except RuntimeError as exc:
                if not summary.interrupted:
                    raise
                print(f"stoker train: interrupted; the checkpoint was not saved: {exc}", file=sys.stderr)
    finally:
        consumer.stop()
    print_summary(summary, args.json, spec, _transform_named(consumer.job.transform, consumer.job.transform_params))
    return _exit_code_of(summary)


def _with_fleet_start(cfg: ConsumerConfig, args: argparse.Namespace, spec, ranks: int) -> ConsumerConfig:
    """With --fleet and no --fleet-start-cores: the planner's estimate, where this machine knows one."""
    if not cfg.fleet or cfg.fleet_start_cores is not None or cfg.dispatcher:
        return cfg
    from stoker.cli_experiments import DEFAULT_CALIBRATION
    from stoker.fleet_estimate import start_cores

    start = start_cores(spec, options.dataset(args, args.data), args.transform or "train",
                        args.transform_params or "", ranks, bool(getattr(args, "pack", False)), DEFAULT_CALIBRATION)
    return replace(cfg, fleet_start_cores=start)


INTERRUPTED_ANSWER_S = 5.0  # Ctrl-C: the checkpoint waits this long for the dispatcher, then the summary comes
CHECKPOINT_ELSEWHERE = "pass --checkpoint elsewhere"  # what a checkpoint the disk refused says to do


def _cmd_run(args: argparse.Namespace) -> int:
    from stoker.embedded import RunConfig, print_summary, run_embedded

    spec = _accel_spec(args)
    # the default /metrics port, taken by another job, is not an error for a job on one machine
    consumer = replace(options.consumer_config(args), metrics_port_or_free=args.metrics_port is None)
    consumer = _with_fleet_start(consumer, args, spec, args.world_size or 1)
    worker_port = 0 if args.worker_metrics_port is None else args.worker_metrics_port  # 0: each a free port
    cfg = RunConfig(data=args.data, dataset=options.dataset(args, args.data), images=args.images, hosts=args.hosts,
                    procs=args.procs, accel=spec, consumer=consumer,
                    worker_metrics_port=None if worker_port < 0 else worker_port,
                    progress=not args.no_progress, log_level=args.log_level,
                    shard_cache_gb=args.shard_cache_gb)
    endpoints: dict[str, str | None] = {}

    def started(consumer: Consumer) -> None:  # say where this job listens: its ports may be free ones
        endpoints.update(metrics=consumer.metrics_url or None, control=consumer.control_endpoint,
                         data=consumer.data_endpoint)
        print(f"stoker: job {consumer.job.job_id} on {endpoints['control']}; metrics "
              + (f"on {endpoints['metrics']} (stoker status --metrics {endpoints['metrics']})"
                 if endpoints["metrics"] else "off"), file=sys.stderr, flush=True)

    summaries = run_embedded(options.job_fields(args), cfg, on_start=started)
    print_summary(summaries, args.json, cfg.accel, _transform_named(args.transform, args.transform_params),
                  endpoints=endpoints)
    return _exit_code_of(summaries)


def _exit_code_of(summaries: Summary | list[Summary]) -> int:
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


def _transform_named(name: str, params: str) -> str:
    """The transform as the closing line names it: with its parameters, when it has any."""
    return f"{name} {params}" if params else name


def _cmd_dispatch(args: argparse.Namespace) -> int:
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


def _cmd_fleet(args: argparse.Namespace) -> int:
    from stoker.accel.control.fleet_config import FleetConfig
    from stoker.accel.control.fleet_service import FleetService

    service = FleetService(configured.config_of(FleetConfig, args))

    def ready(bound: FleetService) -> None:  # said once bound: port 0 is a free port, known only now
        metrics = f"; metrics on :{bound.metrics_port}" if bound.metrics_port else ""
        print(f"stoker fleet: hosts (stoker worker --fleet) and jobs (--fleet) register at {bound.endpoint}{metrics}",
              flush=True)

    service.run(on_ready=ready)
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from stoker.protos import curve

    if args.keys_command == "init":
        folder = curve.init_keys(args.dir)
        print(f"made {folder}/server.key (give it to every worker host) and {folder}/server.key_secret "
              f"(keep it on the accelerator host); add workers with `stoker keys add {folder} NAME`")
    elif args.keys_command == "add":
        secret = curve.add_key(args.dir, args.name, args.role)
        command = "stoker worker" if args.role == "worker" else "stoker train --dispatcher ..."
        print(f"allow-listed {args.name} as a {args.role}; give {secret} and {args.dir}/server.key to that host and "
              f"run `{command} --keys DIR --key-name {args.name} ...` there")
    else:
        print(json.dumps(curve.list_keys(args.dir), indent=1))
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
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


COMMANDS = {"data": _cmd_data, "prepare": cli_prepare.run, "worker": _cmd_worker, "train": _cmd_train,
            "run": _cmd_run, "lab": _cmd_lab, "keys": _cmd_keys, "dispatch": _cmd_dispatch,
            "fleet": _cmd_fleet,
            **cli_experiments.COMMANDS}


def _check_dataset_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Job flags that only one kind of dataset can use, refused for the --dataset given."""
    kind, command = kind_of(args.dataset), args.command
    if args.drop_last and not kind.one_row_per_sample:
        parser.error(f"{command}: argument --drop-last: applies to imagenet jobs only (packed text batches are cut "
                     f"by the packing)")
    if args.corrupt_jpegs != "skip" and not kind.encoded_images:
        parser.error(f"{command}: argument --corrupt-jpegs: applies to image jobs only ({args.dataset} has no JPEGs)")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that cannot work together: refused before anything starts."""
    from stoker.protos.curve import is_loopback

    command = args.command
    if command == "prepare":
        cli_prepare.check(parser, args)
    ranked = command == "train" and bool(args.rank or os.environ.get("RANK", "0") not in ("", "0"))
    if command == "train" and not ranked and bool(args.data) == bool(args.dispatcher):
        parser.error("train: give --data (run the dispatcher here) or --dispatcher ENDPOINT (attach to one), "
                     "not both")
    if command == "train" and args.job_secret and not (args.dispatcher or ranked or (args.world_size or 1) > 1):
        parser.error("train: --job-secret is for ranks and for attaching to a `stoker dispatch` (--dispatcher)")
    if command == "dispatch" and not (args.job_secret or args.journal or args.keys) \
            and args.control_bind.rsplit(":", 1)[-1] in ("0", "*"):
        parser.error("dispatch: argument --control-bind: a free port (0) needs --job-secret FILE, --journal or "
                     "--keys: the default job secret file is named after the port, unknown until it is bound, so "
                     "two such dispatchers would share one")
    job_command = command in ("run", "train", "dispatch")
    if job_command and args.dataset:
        _check_dataset_flags(parser, args)
    if command in ("run", "train", "dispatch"):
        _check_fleet_seat(parser, args, ranked)
    if job_command and args.stall_timeout_s and args.stall_report_s >= args.stall_timeout_s:
        parser.error(f"{command}: argument --stall-report: {args.stall_report_s:g} s is not below --stall-timeout "
                     f"{args.stall_timeout_s:g} s: the job would fail before anyone was told why")
    if command == "worker":
        _settle_worker(parser, args)
    if command == "run":
        args.shard_cache_gb = options.shard_cache_gb(parser, args)
    if job_command:
        bad_transform = options.transform_error(args.transform, args.transform_params, args.image_size,
                                                args.crop_area, args.decode_on)
    else:
        bad_transform = options.transform_error(args.transform, args.transform_params) \
            if command in ("calibrate", "sweep") else None
    if bad_transform:
        parser.error(f"{command}: {bad_transform}")
    too_big = options.image_fit_error(args) if job_command else None
    if too_big:
        parser.error(f"{command}: {too_big}")
    if command == "run" and (args.worker_metrics_port or 0) > 0 and args.worker_metrics_port + args.hosts - 1 > 65535:
        parser.error(f"run: argument --worker-metrics-port: {args.hosts} hosts need ports "
                     f"{args.worker_metrics_port}-{args.worker_metrics_port + args.hosts - 1}, beyond 65535")
    if command in ("train", "run", "dispatch", "worker", "fleet") and not (args.keys or args.insecure):
        names = {"--metrics-addr": args.metrics_addr}
        if command == "fleet":
            names["--bind"] = args.bind
        if command in ("train", "run"):
            names |= {"--data-bind": args.data_bind, "--control-bind": args.control_bind}
        elif command == "dispatch":
            names["--control-bind"] = args.control_bind
        for flag, value in names.items():
            endpoint = value if "://" in value else f"tcp://{value}:0"
            if not is_loopback(endpoint):
                parser.error(f"{command}: argument {flag}: {value} is beyond loopback; without CURVE keys "
                             f"anyone who reaches it could act on the job: pass --keys DIR, or --insecure on a "
                             f"trusted network")


def _check_fleet_seat(parser: argparse.ArgumentParser, args: argparse.Namespace, ranked: bool) -> None:
    """A job's ask of a fleet, refused at parse time when it cannot work: whoever runs the job's dispatcher
    registers it (rank 0, or `stoker dispatch`), and `stoker run --fleet` starts no workers of its own."""
    from stoker.accel.control.fleet_config import fleet_problem

    command = args.command
    bad_seat = fleet_problem(args.fleet, args.weight, args.min_cores, args.max_cores, args.fleet_start_cores)
    if bad_seat:
        field = bad_seat.split(" ", 1)[0]
        flag = f"argument --{field.replace('_', '-')}: " if field in ("weight", "min_cores", "max_cores",
                                                                      "fleet_start_cores") else ""
        parser.error(f"{command}: {flag}{bad_seat.replace('_', '-')}")
    if args.fleet_key_name != "job" and not (args.fleet and getattr(args, "keys", None)):
        parser.error(f"{command}: argument --fleet-key-name: the job's key at a keyed fleet: give --fleet and --keys "
                     "too")
    if args.fleet and command == "train" and (ranked or args.dispatcher):
        parser.error("train: argument --fleet: the job registers where its dispatcher runs (rank 0, or `stoker "
                     "dispatch --fleet`); a rank attached to it measures and says so with its acks")
    if command == "run":
        if args.fleet and args.hosts is not None:
            parser.error("run: argument --hosts: with --fleet the fleet's hosts serve the job (stoker worker --fleet "
                         "on each); this machine's own hosts would be unknown to the fleet")
        args.hosts = (0 if args.fleet else 2) if args.hosts is None else args.hosts
        if args.hosts == 0 and not args.fleet:
            parser.error("run: argument --hosts: 0 hosts would feed nothing (without --fleet)")


def _settle_worker(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The daemon's options the command line left out: from $STOKER_*, then --config, then the defaults."""
    from stoker.workers.worker_config import WorkerConfig

    try:
        settings.settle(WorkerConfig, args, os.environ, args.config)
    except settings.SettingError as exc:
        parser.error(f"worker: {exc}")
    if bool(args.connect) == bool(args.fleet):
        parser.error("worker: give one of the dispatcher's endpoint (--dispatcher tcp://HOST:5561) and a fleet's "
                     "(--fleet tcp://HOST:5570)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`stoker status | head`): nothing more to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush raises nothing
        return 141
    except (StokerError, OSError, ValueError, RuntimeError) as exc:  # Stoker's own, and a library's in its words
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: BaseException) -> int:
    """Exit 2 with the error's line (and a failed job's --json summary, unless that cannot be written either)."""
    from stoker.accel.consumer import JobFailed  # loaded already where a job ran

    if isinstance(exc, JobFailed) and args.command in ("run", "train") and args.json:  # the summary, too
        try:
            options.emit_json(args.json, {"failed": str(exc)})
        except OSError as unwritten:  # a full disk: said too, not a traceback in place of the job's error
            print(f"stoker: error: {unwritten}", file=sys.stderr)
    print(f"stoker: error: {exc}", file=sys.stderr)
    return 2
