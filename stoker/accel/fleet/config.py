"""What `stoker fleet` is told: its socket, its timeouts, its metrics and its keys.

Kept apart from service.py so that the command line can make the options from these fields
(stoker.configured) without importing prometheus_client."""

from __future__ import annotations

from dataclasses import dataclass, field

from stoker.accel.fleet.book import HOST_TIMEOUT_S, JOB_TIMEOUT_S, ROUND_S

FLEET_PORT = 5570


@dataclass(frozen=True)
class FleetConfig:
    bind: str = field(default=f"tcp://127.0.0.1:{FLEET_PORT}", metadata={
        "help": "the fleet's socket, where worker daemons (stoker worker --fleet) and jobs (--fleet) register "
                "(default %(default)s)", "check": "endpoint"})
    host_timeout_s: float = field(default=HOST_TIMEOUT_S, metadata={
        "help": "seconds without a beat before a host's processes are counted lost (default %(default)s; its "
                "jobs' dispatchers redo its units)", "flag": "--host-timeout", "check": "seconds"})
    job_timeout_s: float = field(default=JOB_TIMEOUT_S, metadata={
        "help": "seconds without a beat before a job's processes go to other jobs (default %(default)s)",
        "flag": "--job-timeout", "check": "seconds"})
    round_s: float = field(default=ROUND_S, metadata={
        "help": "seconds between two rounds of moves (default %(default)s)", "flag": "--round", "check": "seconds"})
    max_moves: int = field(default=2, metadata={
        "help": "processes that may change jobs in one round: damping (default %(default)s)", "check": "positive"})
    metrics_port: int | None = field(default=9558, metadata={
        "help": "/metrics port (default %(default)s; -1: none)", "check": "metrics-port", "off": -1})
    metrics_addr: str = field(default="127.0.0.1", metadata={
        "help": "/metrics address (default %(default)s; beyond loopback: with --keys or --insecure)"})
    keys: str | None = field(default=None, metadata={
        "help": "CURVE keys: hosts register with worker keys, jobs with job keys (stoker keys add DIR NAME --role "
                "job)", "metavar": "DIR"})
    insecure: bool = field(default=False, metadata={
        "help": "allow binding beyond loopback without --keys (trusted networks only)"})
