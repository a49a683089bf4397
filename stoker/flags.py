"""Flag types that refuse, at parse time, a value that cannot work, and a parser that says so in one line.

Every numeric flag names its allowed range; a bad value exits 2 with
`stoker run: error: argument --procs: must be an integer >= 1, not '0' (see stoker run --help)`
before anything starts, instead of a hang or a traceback later.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

MAX_PORT = 65535


class Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, not {text!r}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(low: float, high: float = float("inf"), low_open: bool = True) -> Callable[[str], float]:
    """A number in (low, high] (or [low, high] with low_open=False)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        above = value > low if low_open else value >= low
        if not (above and value <= high):
            bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high != float("inf") else "")
            raise argparse.ArgumentTypeError(f"must be a number {bound}, not {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def port(allow_off: bool = False) -> Callable[[str], int]:
    """A TCP port, 0 for any free one; with allow_off, -1 for none."""
    low = -1 if allow_off else 0

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= MAX_PORT:
            extra = ", or -1 for none" if allow_off else ""
            raise argparse.ArgumentTypeError(f"must be a port 0-{MAX_PORT} (0: any free one{extra}), not {text!r}")
        return value

    parse.__name__ = "port"
    return parse


def restart_interval(text: str) -> int:
    """`stoker prepare imagenet --restart-interval-px`: 0 (no transcoding) or 8..65535 pixels, and
    not above 0 where the transcoder was not built."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not (value == 0 or 8 <= value <= MAX_PORT):
        raise argparse.ArgumentTypeError(f"must be 0 (keep the files as they are) or 8-{MAX_PORT} pixels, not {text!r}")
    from pipeline.prepare import transcoder_available

    if value and not transcoder_available():
        raise argparse.ArgumentTypeError("this install has no restart-marker transcoder (pipeline._jpegrestart was "
                                         "not built: libjpeg-turbo's headers were missing); use 0")
    return value


restart_interval.__name__ = "restart interval"

POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)
SECONDS = float_in(0.0)
FRACTION = float_in(0.0, 1.0, low_open=False)
PORT = port()
METRICS_PORT = port(allow_off=True)
