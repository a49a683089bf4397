"""Without CURVE keys nothing listens beyond loopback, unless the operator says the network is trusted.

Anyone who reaches an unkeyed socket can act on the job (feed or steal batches, lease units, read
its metrics), so every role that binds one (a consumer rank, the dispatcher, the fleet, a worker's /metrics)
asks this one question before it starts, and the command line asks it of its flags before anything
starts (`exposure_problem`: the rule and its words, once).
"""

from __future__ import annotations

from collections.abc import Mapping

from stoker.protos.curve import is_loopback
from stoker.protos.errors import ConfigError

FIX = "make keys with `stoker keys init DIR` and give them (--keys DIR), or allow it on a trusted network (--insecure)"


def exposure_problem(listeners: Mapping[str, str], keyed: bool, insecure: bool, risk: str = "act on the job",
                     fix: str = FIX) -> str | None:
    """The rule, said once: without keys, and unless told `insecure`, every listener stays on loopback.
    `listeners`: field -> what it binds (a ZeroMQ endpoint, or the bare address an HTTP server such as
    /metrics binds). The first one beyond loopback as a problem that starts with its field (`metrics_addr:
    0.0.0.0 is beyond loopback; ...`, which the command line says with the field's flag), else None.
    `risk`: what a stranger could do there; `fix`: how this role is given keys or told to allow it."""
    if keyed or insecure:
        return None
    for name, where in listeners.items():
        if not is_loopback(where if "://" in where else f"tcp://{where}:0"):
            return f"{name}: {where} is beyond loopback; without CURVE keys anyone who reaches it could {risk}: {fix}"
    return None


def check_exposure(listeners: Mapping[str, str], keyed: bool, insecure: bool, risk: str = "act on the job",
                   fix: str = FIX) -> None:
    """`exposure_problem`, refused: ConfigError with its words (a role's config checks this at start)."""
    problem = exposure_problem(listeners, keyed, insecure, risk, fix)
    if problem is not None:
        raise ConfigError(problem)
