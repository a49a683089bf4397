"""Flag types that refuse, at parse time, a value that cannot work, and a parser that says so in one line.

Every numeric flag names its allowed range; a bad value exits 2 with
`stoker run: error: argument --procs: must be an integer >= 1, not '0' (see stoker run --help)`
before anything starts, instead of a hang or a traceback later.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from stoker.pipeline.deadline import MIN_CALL_LIMIT_S
from stoker.protos.endpoints import endpoint_problem, peer_endpoint_problem

MAX_PORT = 65535
MAX_INT = 2**31 - 1  # what the wire's int32 fields carry: a count above this cannot be sent
_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() would also take '1_0' and other scripts' digits


class Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def int_at_least(low: int, high: int = MAX_INT) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text) if _INTEGER.fullmatch(text.strip()) else None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, not {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low} and at most {high}, not {text!r}")
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
        if not (above and value <= high and math.isfinite(value)):
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
    from stoker.pipeline.prepare import transcoder_available

    if value and not transcoder_available():
        raise argparse.ArgumentTypeError("this install has no restart-marker transcoder "
                                         "(pipeline.images._jpegrestart was not built: libjpeg-turbo's headers "
                                         "were missing); use 0")
    return value


restart_interval.__name__ = "restart interval"


def endpoint(text: str) -> str:
    """A ZeroMQ endpoint: tcp://HOST:PORT (PORT 0-65535; 0 or * on a bind: any free one), ipc://PATH
    or inproc://NAME. Checked here so a typo is one line now, not a socket error at start-up."""
    why = endpoint_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


endpoint.__name__ = "endpoint"


def peer_endpoint(text: str) -> str:
    """An endpoint this command connects to: where a peer listens, so no wildcard host or port."""
    why = peer_endpoint_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


peer_endpoint.__name__ = "endpoint"

def gigabytes(text: str) -> float:
    """A shard cache's size limit, as $STOKER_SHARD_CACHE_GB has always been read (pipeline.store.shard_cache)."""
    from stoker.pipeline.store.shard_cache import parse_gb

    try:
        return parse_gb(text, "GB")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("GB: ")) from None


gigabytes.__name__ = "GB"

def host_id(text: str) -> str:
    """A host's name to the dispatcher: it is in worker ids, log lines and metric labels, so it is short
    (the dispatcher takes names up to 256 characters, and a worker id adds to it) and plain."""
    from stoker.workers.worker_config import HOST_ID_CHARS, MAX_HOST_ID

    if not 0 < len(text) <= MAX_HOST_ID or not HOST_ID_CHARS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_HOST_ID} letters, digits and . _ - : @ + (no spaces, "
                                         f"slashes or control characters), not {text[:80]!r}")
    return text


host_id.__name__ = "host id"


def procs(text: str) -> int:
    """Decode processes per host: 1 up to workers.worker_config.most_procs()."""
    from stoker.workers.worker_config import most_procs

    return int_at_least(1, most_procs())(text)


procs.__name__ = "procs"


def output_file(dash_is_stdout: bool = False) -> Callable[[str], str]:
    """A file a command writes as it ends (`-` with dash_is_stdout: standard output): its folder must be a
    folder that takes files now, or a whole job runs only to fail writing its summary or its checkpoint."""
    def parse(text: str) -> str:
        if dash_is_stdout and text == "-":
            return text
        why = unwritable(Path(text))
        if why:
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: {why}")
        return text

    parse.__name__ = "path"
    return parse


def output_folder(text: str) -> str:
    """A folder a command writes files into as it runs: one that is (or can be made as) a folder now."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write into {text!r}: it is a file, not a folder")
    why = unwritable(path) if not path.exists() else None if os.access(path, os.W_OK | os.X_OK) else "not writable"
    if why:
        raise argparse.ArgumentTypeError(f"cannot make the folder {text!r}: {why}")
    return text


output_folder.__name__ = "folder"


def unwritable(path: Path) -> str | None:
    """Why a file cannot be written at `path` by this user (None: it can be, as far as can be told now)."""
    folder = path.parent
    if path.is_dir():
        return "it is a folder; give a file's path"
    if not folder.exists():
        return f"the folder {str(folder)!r} does not exist"
    if not folder.is_dir():
        return f"{str(folder)!r} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {str(folder)!r} is not writable"
    return None

POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)
SEED = int_at_least(0, 2**64 - 1)  # the wire's seed is a uint64
SECONDS = float_in(0.0)
FRACTION = float_in(0.0, 1.0, low_open=False)
METRICS_PORT = port(allow_off=True)

# The checks a config field names in its metadata (stoker.configured): the configs' packages sit
# below the command line and cannot import these functions, so they name them.
CHECKS: dict[str, Callable[[str], object]] = {
    "positive": POSITIVE, "non-negative": NON_NEGATIVE, "seconds": SECONDS, "above-zero": SECONDS, "fraction": FRACTION,
    "metrics-port": METRICS_PORT, "gigabytes": gigabytes, "restart-interval": restart_interval,
    "transform-timeout": float_in(MIN_CALL_LIMIT_S, 86400.0, low_open=False), "scale": float_in(0.0, 1.0),
    "seq-len": int_at_least(8), "lm-seq-len": int_at_least(2, 1 << 20),
    "endpoint": endpoint, "peer-endpoint": peer_endpoint, "seed": SEED,
    "host-id": host_id, "procs": procs, "seconds-or-never": float_in(0.0, 7 * 86400.0, low_open=False),
}
