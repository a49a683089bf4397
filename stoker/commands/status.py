"""`stoker status`: what bounds a running job, from its consumer's (or a fleet's) metrics."""

from __future__ import annotations

import argparse
import json

from stoker.flags import POSITIVE, float_in
from stoker.options import emit_json, json_option


def add_parser(sub) -> None:
    status = sub.add_parser("status", help="what bounds a running job's throughput, from its consumer's metrics "
                                           "(or a fleet's jobs, from the fleet's)")
    status.add_argument("--metrics", default="http://127.0.0.1:9560/metrics",
                        help="the consumer's /metrics URL, or a fleet's (stoker fleet: port 9558): each job's "
                             "processes, need, stall and share")
    json_option(status, "the figures (with --watch: one line per refresh)")
    status.add_argument("--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float_in(0.1), default=1.0, help="--watch: seconds between refreshes")
    status.add_argument("--count", type=POSITIVE, help="--watch: stop after this many refreshes")


def run(args: argparse.Namespace) -> int:
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
