"""The `stoker` command: builds the parser from one module per command (stoker.commands) and runs the one asked.

Each command's module has `add_parser(sub)`, `run(args) -> int` and, where flags can refuse each other,
`check(parser, args)`, called right after parsing so that a flag that cannot work exits 2 with one line
naming it, before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from types import ModuleType

from stoker import __version__, options
from stoker.commands import (
    audit,
    calibrate,
    data,
    dispatch,
    fleet,
    keys,
    lab,
    plan,
    prepare,
    run,
    status,
    sweep,
    train,
    worker,
)
from stoker.flags import Parser
from stoker.protos.errors import StokerError

# in the order --help lists them
COMMANDS: dict[str, ModuleType] = {
    "data": data, "prepare": prepare, "worker": worker, "keys": keys, "train": train, "dispatch": dispatch,
    "fleet": fleet, "run": run, "lab": lab, "sweep": sweep, "calibrate": calibrate, "plan": plan, "status": status,
    "audit": audit}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stoker", description="Keep accelerators fed.")
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG, INFO, WARNING (default) or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that cannot work together: refused before anything starts, by the command's own checks."""
    check = getattr(COMMANDS[args.command], "check", None)
    if check is not None:
        check(parser, args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return COMMANDS[args.command].run(args)
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
