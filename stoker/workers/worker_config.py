"""What a worker daemon is told: its dispatcher, processes, metrics, keys and cache.

Kept apart from stoker/workers/daemon.py so that the command line can make `stoker worker`'s options
from these fields without importing prometheus_client (the daemon sets its multi-process folder
first). Each field with a help line is an option (stoker.configured); `setting: False` marks
what only a parent process passes, never a file or a STOKER_* variable (stoker.settings)."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field

from stoker.protos.endpoints import peer_endpoint_problem

MAX_HOST_ID = 200  # the dispatcher's names go to 256 characters (control.serving.server.MAX_NAME): room for "/p3.17"
HOST_ID_CHARS = re.compile(r"[A-Za-z0-9._:@+-]+")


@dataclass(frozen=True)
class WorkerConfig:
    connect: str = field(default="", metadata={  # dispatcher control endpoint
        "help": "the one job's dispatcher endpoint, e.g. tcp://10.0.0.5:5561 (or --fleet)", "flag": "--dispatcher",
        "metavar": "ENDPOINT", "check": "peer-endpoint"})
    fleet: str = field(default="", metadata={  # a fleet's endpoint: serve the jobs it gives this host
        "help": "a fleet's endpoint (stoker fleet), e.g. tcp://10.0.0.5:5570: serve whichever jobs it gives this "
                "host, one job per process (instead of --dispatcher)", "metavar": "ENDPOINT", "check": "peer-endpoint"})
    procs: int = field(default=1, metadata={
        "help": "decode processes on this host, about one per core given to Stoker (default %(default)s; at most "
                "4 per core of the host, and 8 on any host)", "check": "procs"})
    host_id: str = field(default="", metadata={
        "help": "this host's name to the dispatcher, in its metrics and logs: up to 200 letters, digits and . _ - : "
                "@ + (default: HOSTNAME-PID)", "check": "host-id"})
    metrics_port: int | None = field(default=9561, metadata={
        "help": "/metrics port (default %(default)s; -1: none)", "check": "metrics-port", "off": -1})
    metrics_addr: str = field(default="127.0.0.1", metadata={
        "help": "/metrics address (default %(default)s; beyond loopback: with --keys or --insecure)"})
    metrics_flag: str = field(default="--metrics-port", metadata={  # named when the port is taken
        "help": "the option that set the metrics port, as the error names it (stoker run's is its own)",
        "flag": "--metrics-port-flag", "hidden": True, "setting": False})
    once: bool = field(default=False, metadata={  # exit after one job instead of waiting for the next
        "help": "exit after one job (once it has heard it finish)"})
    drain_timeout_s: float = 10.0
    leave_after_s: float = field(default=30.0, metadata={  # and keep registering
        "help": "leave a job whose dispatcher has been silent this many seconds (default %(default)s); the daemon "
                "keeps registering and rejoins it when it answers", "flag": "--leave-after", "check": "seconds"})
    keys: str | None = field(default=None, metadata={  # server.key + workers/<key_name>.key_secret
        "help": "CURVE key folder holding server.key and workers/NAME.key_secret", "metavar": "DIR"})
    key_name: str = field(default="", metadata={"help": "this host's key NAME (default: the host id)"})
    insecure: bool = field(default=False, metadata={  # allow serving metrics beyond loopback without keys
        "help": "allow binding beyond loopback without --keys (trusted networks only)"})
    parent_pid: int | None = field(default=None, metadata={  # `stoker run`'s daemons
        "help": "exit when the process with this pid is gone (stoker run starts its daemons so)",
        "check": "positive", "setting": False})
    shard_cache_gb: float | None = field(default=None, metadata={
        "help": "keep this host's cache of remote shards under GB, least recently used shards removed first, never "
                "one a process has open (default: $STOKER_SHARD_CACHE_GB, else no limit)",
        "check": "gigabytes", "metavar": "GB"})

    def problem(self) -> str | None:
        """What cannot work together in these options (None: all can), said from the field it starts with."""
        if bool(self.connect) == bool(self.fleet):
            return ("connect: give one of the dispatcher's endpoint (--dispatcher tcp://HOST:5561) and a fleet's "
                    "(--fleet tcp://HOST:5570)")
        for name in ("connect", "fleet"):
            why = peer_endpoint_problem(getattr(self, name)) if getattr(self, name) else None
            if why:
                return f"{name} {why}"
        return None

    def resolved_host_id(self) -> str:
        """--host-id, else HOSTNAME-PID with what a host id may not hold replaced by "_"."""
        if self.host_id:
            return self.host_id
        suffix = f"-{os.getpid()}"
        name = "".join(c if HOST_ID_CHARS.fullmatch(c) else "_" for c in socket.gethostname()) or "host"
        return name[:MAX_HOST_ID - len(suffix)] + suffix


def most_procs() -> int:
    """The most decode processes a daemon starts: 4 per core it may run on (8 at least). Each holds
    its own interpreter, decoder and shard readers (about 100 MB); hundreds of them on a few cores
    add memory and switching, not throughput, and the host ran out of memory starting them."""
    return max(8, 4 * len(os.sched_getaffinity(0)))
