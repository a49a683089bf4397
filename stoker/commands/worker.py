"""`stoker worker`: the per-host daemon, its options made from `WorkerConfig`."""

from __future__ import annotations

import argparse
import os

from stoker import configured, settings
from stoker.commands.common import check_loopback
from stoker.options import Deprecated


def add_parser(sub) -> None:
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


def run(args: argparse.Namespace) -> int:
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


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The daemon's options the command line left out: from $STOKER_*, then --config, then the defaults; then
    what cannot work together."""
    from stoker.workers.worker_config import WorkerConfig

    try:
        settings.settle(WorkerConfig, args, os.environ, args.config)
    except settings.SettingError as exc:
        parser.error(f"worker: {exc}")
    bad = configured.config_of(WorkerConfig, args).problem()
    if bad:
        parser.error(f"worker: {configured.as_flag_problem(WorkerConfig, bad)}")
    check_loopback(parser, args, {"--metrics-addr": args.metrics_addr})
