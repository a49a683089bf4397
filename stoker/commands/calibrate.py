"""`stoker calibrate`: this machine's per-core supply rates."""

from __future__ import annotations

import argparse
from pathlib import Path

from stoker.commands.common import DEFAULT_CALIBRATION, check_transform, transform_options
from stoker.flags import SECONDS


def add_parser(sub) -> None:
    cal = sub.add_parser("calibrate", help="per-core supply rates of this machine (under a minute)")
    cal.add_argument("--seconds", type=SECONDS, default=15.0, help="per dataset (default 15)")
    cal.add_argument("--out", type=Path, default=DEFAULT_CALIBRATION,
                     help="the calibration file; a measurement replaces only its own rates in it (default %(default)s)")
    transform_options(cal, None)
    cal.add_argument("--data", help="--transform: the image manifest to measure on (default: the generated set)")
    cal.add_argument("--tokens", metavar="MANIFEST",
                     help="measure only a tokens job (its shards read and packed) and its tokenizer alone, on this "
                          "token set (`stoker prepare tokens`); without it, all kinds are measured, tokens on the "
                          "World English Bible cut by a shipped byte-level BPE")


def run(args: argparse.Namespace) -> int:
    from stoker.calibrate import (
        PACKED,
        TOKENIZE,
        TOKENS,
        calibrate,
        calibrate_tokens,
        calibrate_transform,
        rate_text,
        writable,
    )
    from stoker.datasets import default_imagenet, default_tokens, default_wikipedia

    writable(args.out)  # before the data sets are made and minutes are measured, not after
    if args.transform is not None:
        r = calibrate_transform(args.data or str(default_imagenet()), args.transform, args.transform_params,
                                args.seconds, args.out)
        print(f"{args.transform}: {rate_text(r)} ({r['what']}; {r['version']})")
        print(f"written to {args.out}")
        return 0
    if args.tokens is not None:
        result = calibrate_tokens(args.tokens, args.seconds, args.out)
    else:
        result = calibrate(str(default_imagenet()), str(default_wikipedia()), args.seconds, args.out,
                           str(default_tokens()))
    for name in ("imagenet", "wikipedia", PACKED, TOKENS, TOKENIZE) if args.tokens is None else (TOKENS, TOKENIZE):
        r = result[name]
        print(f"{name}: {rate_text(r)} ({r['what']})")
    print(f"written to {args.out}")
    return 0


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--tokens measures a token set alone: not with an image --transform or its --data."""
    if args.tokens is not None and (args.transform is not None or args.data):
        parser.error("calibrate: --tokens measures a token set alone; leave out --transform and --data")
    check_transform(parser, args)
