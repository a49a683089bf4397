"""Prometheus metrics of the control plane: served by the standalone dispatcher (`stoker dispatch`),
and by rank 0's consumer when the dispatcher lives in it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from stoker.accel.control.failures import failure_kind
from stoker.protos.errors import ResourceError


class ControlMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.units = Gauge("stoker_dispatcher_units", "Work units by state", ["state"], registry=r)
        self.workers_alive = Gauge("stoker_dispatcher_workers_alive", "Worker hosts with a live heartbeat",
                                   registry=r)
        self.ranks_silent = Gauge("stoker_dispatcher_ranks_silent",
                                  "Consumer ranks not heard from for longer than the host timeout (their streams "
                                  "stall; the job cannot finish without them), a rank whose stream is done not "
                                  "counted", registry=r)
        self.releases = Counter("stoker_dispatcher_releases", "Work units re-leased after a loss",
                                ["reason"], registry=r)
        self.auth = Counter("stoker_consumer_auth",
                            "CURVE connections: admitted, refused (key not allow-listed) or failed_handshake "
                            "(no key, or not this service's server key)", ["result"], registry=r)
        self.journal_group = Histogram("stoker_dispatcher_journal_group_requests",
                                       "Control requests answered after one fsync of the journal (group commit)",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.journal_compactions = Counter("stoker_dispatcher_journal_compactions",
                                           "Journal compactions to a snapshot, one as each epoch is done", registry=r)
        self.journal_bytes = Gauge("stoker_dispatcher_journal_bytes", "Size of the journal file", registry=r)
        self.refusals = Counter("stoker_dispatcher_refusals", "Worker processes that refused the job (they cannot "
                                "run its transform as pinned); the first one fails the job", registry=r)
        self.failure = Gauge("stoker_job_failed", "1 once the job has failed, labelled with the kind of its reason "
                             "(refused, stalled, dispatcher_gone, other; the whole line is in the log); no sample "
                             "while it goes on", ["reason"], registry=r)
        self.rank_waiting = Gauge("stoker_rank_waiting_seconds", "How long each rank has waited for its next batch "
                                  "(0: it is not waiting; the stall watchdog reports past --stall-report)", ["rank"],
                                  registry=r)
        self.stall_holders = Gauge("stoker_stall_holder_seconds",
                                   "While a rank has waited past --stall-report: each process that holds a unit of "
                                   "its stream, and how long it has been in its phase (leasing, reading, transforming, "
                                   "sending, waiting for credit; sample: the one it reads or transforms)",
                                   ["rank", "unit", "host", "process", "phase", "sample"], registry=r)
        self.poison_samples = Counter("stoker_dispatcher_poison_samples", "Samples skipped from then on because the "
                                      "transform killed two worker processes on them", registry=r)
        self.control_dropped = Counter("stoker_dispatcher_messages_dropped",
                                       "Control messages dropped as malformed or not allowed to the sender's role",
                                       ["reason"], registry=r)

    def job_failed(self, line: str) -> None:
        """The job failed with `line` (free text, perhaps a peer's): counted under its kind, never its words."""
        self.failure.labels(reason=failure_kind(line)).set(1)

    def serve(self, port: int, addr: str) -> int:
        """Serve /metrics; returns the bound port (useful with port 0)."""
        return serve_registry(self.registry, port, addr)


def serve_registry(registry: CollectorRegistry, port: int, addr: str) -> int:
    """Serve `registry` on /metrics; returns the bound port (useful with port 0)."""
    try:
        server, _ = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ResourceError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} "
                            f"(pick another with --metrics-port)") from exc
    return int(server.server_port)
