"""What a host daemon does before it serves, and around its loop: said once for `stoker worker` (workers.daemon)
and `stoker worker --fleet` (workers.fleet_agent).

Its settings checked (--procs within what the host may run, the metrics port not exposed without keys), its
log's format (a fleet's job daemon, in a process of its own, sets it again), SIGTERM and SIGINT to drain, its
death with the process that started it (workers.lifeline), the metrics port, and systemd's readiness,
watchdog and stopping (protos.sd_notify).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from stoker.protos.endpoints import serves
from stoker.protos.errors import ConfigError
from stoker.protos.exposure import check_exposure
from stoker.protos.sd_notify import Notifier
from stoker.workers.lifeline import exit_with_parent, parent_alive
from stoker.workers.metrics import serve_multiprocess
from stoker.workers.worker_config import WorkerConfig, most_procs

log = logging.getLogger("stoker.worker")

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(level: int) -> None:
    """The daemons' log format, in a process of their own (the command line sets it for `stoker worker`)."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


def check_host_settings(cfg: WorkerConfig) -> None:
    """Refuse, at start, settings this host cannot serve with."""
    if not 1 <= cfg.procs <= most_procs():
        raise ConfigError(f"--procs must be 1 to {most_procs()} on this host (4 per core it may run on), "
                          f"not {cfg.procs}")
    check_exposure({"metrics_addr": cfg.metrics_addr}, bool(cfg.keys), cfg.insecure, risk="read this host's metrics")


class HostPreamble:
    """A host daemon's start and its loop's duties: made first (it checks the settings), `begin` before it
    serves, `alive` each time round its loop, `end` when it stops."""

    def __init__(self, cfg: WorkerConfig, host_id: str) -> None:
        check_host_settings(cfg)
        self.cfg, self.host_id = cfg, host_id
        self.systemd = Notifier()
        self.metrics_port: int | None = None

    def begin(self, on_stop: Callable[[int, object], None], ready_status: str) -> None:
        """Drain on SIGTERM and SIGINT (`on_stop`), die with the parent, serve the metrics, tell systemd."""
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        if self.cfg.parent_pid is not None:
            exit_with_parent(self.cfg.parent_pid)
        if serves(self.cfg.metrics_port):
            self.metrics_port = serve_multiprocess(self.cfg.metrics_port, self.cfg.metrics_addr, self.cfg.metrics_flag)
            log.info("%s: metrics on http://%s:%d/metrics", self.host_id, self.cfg.metrics_addr, self.metrics_port)
        self.systemd.ready(ready_status)

    def parent_gone(self) -> bool:
        """The process that started this daemon (`stoker run`, a fleet agent) is gone."""
        return self.cfg.parent_pid is not None and not parent_alive(self.cfg.parent_pid)

    def alive(self) -> bool:
        """Once round the loop: feed systemd's watchdog; False when the parent is gone (the daemon stops)."""
        self.systemd.watchdog()
        return not self.parent_gone()

    def end(self) -> None:
        self.systemd.stopping()
