"""Without CURVE keys nothing listens beyond loopback, unless the operator says the network is trusted.

Anyone who reaches an unkeyed socket can act on the job (feed or steal batches, lease units, read
its metrics), so every role that binds one (a consumer rank, the dispatcher, a worker's /metrics)
asks this one question before it starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from stoker.protos.curve import is_loopback
from stoker.protos.errors import ConfigError

FIX = "make keys with `stoker keys init DIR` and give them (--keys DIR), or allow it on a trusted network (--insecure)"


def check_exposure(listeners: Iterable[str], keyed: bool, insecure: bool, risk: str = "act on the job",
                   fix: str = FIX) -> None:
    """Refuse the first listener beyond loopback when there are no keys and nobody said `insecure`.
    A listener: a ZeroMQ endpoint, or the bare address an HTTP server (/metrics) binds. `risk`: what a
    stranger could do there; `fix`: how this role is given keys or told to allow it."""
    if keyed or insecure:
        return
    for where in listeners:
        if not is_loopback(where if "://" in where else f"tcp://{where}:0"):
            raise ConfigError(f"refusing to bind {where} without CURVE keys: anyone who can reach it could {risk}; "
                             f"{fix}")
