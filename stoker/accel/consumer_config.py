"""How a consumer rank listens, and where: its sockets, metrics, credit and timeouts.

Kept apart from stoker/accel/consumer.py so that the command line can read these defaults without
importing prometheus_client (a worker daemon must set its multi-process folder first)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stoker.accel.control.dispatch_config import (
    control_bind,
    host_timeout,
    lease_timeout,
    stall_problem,
    stall_report,
    stall_timeout,
)
from stoker.accel.control.fleet_seat import FleetSeat
from stoker.protos.endpoints import MAX_PORT, NO_PORT, endpoint_problem, peer_endpoint_problem
from stoker.protos.errors import ConfigError
from stoker.protos.exposure import check_exposure

METRICS_PORT = 9560  # a job's rank 0 (and a single consumer)
RANK_METRICS_BASE = 9570  # local rank r > 0 of a data-parallel job: 9570 + r, clear of the daemons' 9561 + i


def rank_metrics_port(local_rank: int) -> int:
    """The /metrics port a rank serves on by default: one per local rank, so the ranks of one
    machine (8 on a DGX) never collide with each other or with a worker daemon there."""
    return METRICS_PORT if local_rank == 0 else RANK_METRICS_BASE + local_rank


@dataclass(frozen=True)
class ConsumerConfig:
    """How one rank's consumer runs: the sockets it binds, its metrics endpoint, the credit and
    timeouts it gives workers, and the dispatcher and keys it uses. The defaults suit one machine."""

    data_bind: str = field(default="tcp://127.0.0.1:5560", metadata={"help": "data socket (default %(default)s)",
                                                                       "check": "endpoint"})
    control_bind: str = control_bind()
    advertise_host: str | None = field(default=None, metadata={  # host name workers use to reach this machine
        "help": "host name workers use to reach this machine"})
    metrics_port: int | None = METRICS_PORT  # None: no HTTP endpoint; 0: a free port (Consumer.metrics_port)
    metrics_port_or_free: bool = False  # the port was a default, not asked for: if it is taken, use a free one
    metrics_addr: str = field(default="127.0.0.1", metadata={
        "help": "/metrics address (default %(default)s; beyond loopback: with --keys or --insecure)"})
    credit_window: int = field(default=3, metadata={  # batches in flight per worker process
        "help": "batches in flight per worker process (default %(default)s)", "check": "positive"})
    overlap: bool = field(default=True, metadata={  # convert/copy batch N+1 on a side thread while step N runs
        "help": "convert and copy each batch between steps instead of during the previous one",
        "flag": "--no-overlap"})
    host_timeout_s: float = host_timeout()
    lease_timeout_s: float = lease_timeout()
    stall_report_s: float = stall_report()
    stall_timeout_s: float = stall_timeout()
    dispatcher: str | None = field(default=None, metadata={  # None: the dispatcher runs in this process
        "help": "attach to a `stoker dispatch` at this endpoint instead of running one here", "metavar": "ENDPOINT",
        "check": "peer-endpoint"})
    key_name: str = field(default="consumer", metadata={  # with keys and a separate dispatcher: this consumer's key
        "help": "with --dispatcher and --keys: this consumer's key (stoker keys add DIR NAME --role consumer; "
                "default: %(default)s)"})
    job_secret: str | None = field(default=None, metadata={  # without keys and with a separate dispatcher
        "help": "with --dispatcher and no --keys: the job secret `stoker dispatch` wrote (or set $STOKER_JOB_SECRET); "
                "it proves this process is the job's consumer", "metavar": "FILE"})
    keys: str | None = field(default=None, metadata={  # CURVE key folder: encrypt, admit allow-listed workers only
        "help": "CURVE keys (stoker keys init): encrypt every link and admit only allow-listed workers",
        "metavar": "DIR"})
    insecure: bool = field(default=False, metadata={  # allow binding non-loopback addresses without keys
        "help": "allow binding beyond loopback without keys (trusted networks only)"})
    decode_threads: int = field(default=1, metadata={  # --decode-on accelerator: DALI's CPU threads on the consumer
        "help": "--decode-on accelerator: DALI CPU threads on the consumer (default %(default)s)", "check": "positive"})
    sender_timeout_s: float = field(default=30.0, metadata={  # free the credit window of a sender silent this long
        "help": "seconds a worker process may stay silent (answering no ping) before its credit window is freed "
                "(default %(default)s)", "flag": "--sender-timeout", "check": "seconds"})
    finish_linger_s: float = 3.0  # after the last ack, keep answering until every live host heard "finished"
    rank_wait_s: float = 60.0  # rank 0, at the end: how long its dispatcher waits for the other ranks' acks
    attach_timeout_s: float = field(default=60.0, metadata={  # how long a rank waits for the dispatcher it attaches to
        "help": "with --dispatcher (or as a rank other than 0): give up on a dispatcher that does not answer for this "
                "long (default %(default)s)", "flag": "--attach-timeout", "check": "seconds"})
    seat: FleetSeat = field(default=FleetSeat(), metadata={"options": True})  # --fleet ...; no fleet by default
    credit_budget_mb: float = field(default=1024.0, metadata={  # in flight or waiting, in all, in MB
        "help": "what this rank may have in flight or waiting, in all (default %(default)s MB)", "check": "seconds"})

    def __post_init__(self) -> None:
        """What the command line refuses at parse time is refused here too, where a script makes the
        config: a Loader given a credit window of 0 would wait for ever, a bad endpoint would fail
        deep in its start."""
        why = consumer_config_problem(self)
        if why:
            raise ConfigError(f"ConsumerConfig: {why}")

    def check_exposure(self) -> None:
        """Without keys, refuse to listen beyond loopback unless told to."""
        check_exposure({"data_bind": self.data_bind, "control_bind": self.control_bind,
                        "metrics_addr": self.metrics_addr}, bool(self.keys), self.insecure,
                       risk="feed or steal batches or read the job's metrics",
                       fix="make keys with `stoker keys init DIR` and give them (--keys DIR; a Loader: keys=DIR or "
                           "$STOKER_KEYS=DIR), or allow it on a trusted network (--insecure; a Loader: "
                           "insecure=True or $STOKER_INSECURE=1)")


_AT_LEAST_ONE = ("credit_window", "decode_threads")
_ABOVE_ZERO = ("host_timeout_s", "lease_timeout_s", "stall_report_s", "sender_timeout_s", "attach_timeout_s",
               "credit_budget_mb", "rank_wait_s")
_NOT_NEGATIVE = ("stall_timeout_s", "finish_linger_s")


def consumer_config_problem(cfg: ConsumerConfig) -> str | None:
    """The first value of `cfg` that cannot work, said as its flag's check says it (None: all can)."""
    for name in _AT_LEAST_ONE:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be an integer of at least 1, not {value!r}"
    for name, low in [(n, 0.0) for n in _ABOVE_ZERO] + [(n, -1.0) for n in _NOT_NEGATIVE]:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value < float("inf"):
            return f"{name} must be a number {'above 0' if low == 0 else 'of at least 0'}, not {value!r}"
    stalls = stall_problem(cfg.stall_report_s, cfg.stall_timeout_s)
    if stalls:
        return stalls
    port = cfg.metrics_port
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not NO_PORT <= port <= MAX_PORT):
        return f"metrics_port must be a port 0-{MAX_PORT} (0: any free one; -1 or None: none), not {port!r}"
    for name in ("data_bind", "control_bind", "dispatcher"):
        value = getattr(cfg, name)
        check = peer_endpoint_problem if name == "dispatcher" else endpoint_problem
        why = None if value is None and name == "dispatcher" else check(value)
        if why:
            return f"{name} {why}"
    if not isinstance(cfg.seat, FleetSeat):  # a FleetSeat is checked as it is made (its one check)
        return f"seat must be a FleetSeat, not {cfg.seat!r}"
    return None
