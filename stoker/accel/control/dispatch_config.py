"""What a `stoker dispatch` is told: its socket, journal, timeouts, metrics and keys.

Kept apart from stoker/accel/control/service.py so that the command line can make `stoker dispatch`'s
options from these fields (stoker.configured) without importing prometheus_client, which a
worker daemon must not see loaded before it sets its multi-process folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stoker.accel.control.fleet_seat import FleetSeat
from stoker.protos import job_secret


def control_bind() -> Any:
    """The dispatcher's socket, as `stoker dispatch` and a consumer that runs its own dispatcher take it."""
    return field(default="tcp://127.0.0.1:5561", metadata={
        "help": "dispatcher socket (default %(default)s)", "check": "endpoint"})


def host_timeout() -> Any:
    """How long a host may go without a heartbeat: the dispatcher's option, wherever it runs."""
    return field(default=10.0, metadata={
        "help": "seconds without a heartbeat before a host's units are re-leased (default %(default)s)",
        "flag": "--host-timeout", "check": "seconds"})


def lease_timeout() -> Any:
    """How long a unit may stay leased, even to a live host: the dispatcher's option, wherever it runs."""
    return field(default=600.0, metadata={
        "help": "seconds a unit may stay leased before it is leased again, even to a live host: what ends the wait "
                "for a transform that hangs (default %(default)s)", "flag": "--lease-timeout", "check": "seconds"})


def stall_report() -> Any:
    """How long a rank may wait for a batch before the dispatcher says who holds it (accel.control.watchdog)."""
    return field(default=60.0, metadata={
        "help": "seconds a rank may wait for its next batch before the dispatcher logs which process holds what it "
                "waits for, and what that process is doing (default %(default)s)", "flag": "--stall-report",
        "check": "seconds"})


def stall_timeout() -> Any:
    """How long a rank may wait for a batch before the job fails with that line; 0: for ever."""
    return field(default=300.0, metadata={
        "help": "seconds a rank may wait for its next batch before the job fails, naming who held it (default "
                "%(default)s; 0: wait for ever)", "flag": "--stall-timeout", "check": "seconds-or-never"})


def stall_problem(stall_report_s: float, stall_timeout_s: float) -> str | None:
    """A job that would fail of a stall before the stall was reported (None: the report comes first)."""
    if stall_timeout_s and stall_report_s >= stall_timeout_s:
        return (f"stall_report_s ({stall_report_s:g}) must be below stall_timeout_s ({stall_timeout_s:g}): "
                "the job would fail before anyone was told why")
    return None


@dataclass(frozen=True)
class DispatchConfig:
    control_bind: str = control_bind()
    advertise_host: str | None = field(default=None, metadata={"help": "host name workers use to reach this machine"})
    journal: str | None = field(default=None, metadata={
        "help": "append-only journal; restart with it to continue", "metavar": "PATH"})
    host_timeout_s: float = host_timeout()
    lease_timeout_s: float = lease_timeout()
    stall_report_s: float = stall_report()
    stall_timeout_s: float = stall_timeout()
    metrics_port: int | None = field(default=9559, metadata={  # 9560 is the consumer, 9561 + i `stoker run`'s workers
        "help": "/metrics port (default %(default)s; -1: none)", "check": "metrics-port", "off": -1})
    metrics_addr: str = field(default="127.0.0.1", metadata={
        "help": "/metrics address (default %(default)s; beyond loopback: with --keys or --insecure)"})
    keys: str | None = field(default=None, metadata={
        "help": "CURVE keys: workers and consumers by their keys' roles", "metavar": "DIR"})
    insecure: bool = field(default=False, metadata={
        "help": "allow binding beyond loopback without --keys (trusted networks only)"})
    job_secret: str | None = field(default=None, metadata={  # without keys: the consumer credential's file
        "help": "without --keys: where the consumer's job secret is kept (made on first start, mode 0600; default "
                "JOURNAL.secret, else stoker-job-PORT.secret in $XDG_RUNTIME_DIR or TMPDIR/stoker-UID; a file that "
                "is not yours with mode 0600 is refused; $STOKER_JOB_SECRET overrides)", "metavar": "FILE"})
    linger_s: float = 5.0  # keep answering "finished" this long after the last ack
    seat: FleetSeat = field(default=FleetSeat(), metadata={"options": True})  # --fleet ...; no fleet by default

    def problem(self) -> str | None:
        """What cannot work together in these options (None: all can), said from the field it starts with."""
        if not (self.job_secret or self.journal or self.keys) and self.control_bind.rsplit(":", 1)[-1] in ("0", "*"):
            return ("control_bind: a free port (0) needs --job-secret FILE, --journal or --keys: the default job "
                    "secret file is named after the port, unknown until it is bound, so two such dispatchers would "
                    "share one")
        return stall_problem(self.stall_report_s, self.stall_timeout_s)

    def secret_path(self) -> str:
        if self.job_secret:
            return self.job_secret
        return f"{self.journal}.secret" if self.journal else str(job_secret.default_path(self.control_bind))
