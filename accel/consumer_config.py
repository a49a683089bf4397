"""How a consumer rank listens, and where: its sockets, metrics, credit and timeouts.

Kept apart from accel/consumer.py so that the command line can read these defaults without
importing prometheus_client (a worker daemon must set its multi-process folder first)."""

from __future__ import annotations

from dataclasses import dataclass

from protos.curve import is_loopback

METRICS_PORT = 9560  # a job's rank 0 (and a single consumer)
RANK_METRICS_BASE = 9570  # local rank r > 0 of a data-parallel job: 9570 + r, clear of the daemons' 9561 + i


def rank_metrics_port(local_rank: int) -> int:
    """The /metrics port a rank serves on by default: one per local rank, so the ranks of one
    machine (8 on a DGX) never collide with each other or with a worker daemon there."""
    return METRICS_PORT if local_rank == 0 else RANK_METRICS_BASE + local_rank


@dataclass(frozen=True)
class ConsumerConfig:
    data_bind: str = "tcp://127.0.0.1:5560"
    control_bind: str = "tcp://127.0.0.1:5561"
    advertise_host: str | None = None  # host name workers use to reach this machine
    metrics_port: int | None = METRICS_PORT  # None: no HTTP endpoint; 0: a free port (Consumer.metrics_port)
    metrics_addr: str = "127.0.0.1"
    credit_window: int = 3  # batches in flight per worker process
    overlap: bool = True  # convert/copy batch N+1 on a side thread while step N runs
    host_timeout_s: float = 10.0
    dispatcher: str | None = None  # a `stoker dispatch` endpoint; None: the dispatcher runs in this process
    key_name: str = "consumer"  # with keys and a separate dispatcher: this consumer's key (keys add --role consumer)
    job_secret: str | None = None  # without keys and with a separate dispatcher: the job credential's file
    keys: str | None = None  # CURVE key folder (stoker keys init): encrypt, admit allow-listed workers only
    insecure: bool = False  # allow binding non-loopback addresses without keys
    decode_threads: int = 1  # --decode-on accelerator: DALI's CPU threads on the consumer
    sender_timeout_s: float = 30.0  # free the credit window of a sender that answers no ping this long
    finish_linger_s: float = 3.0  # after the last ack, keep answering until every live host heard "finished"
    rank_wait_s: float = 60.0  # rank 0, at the end: how long its dispatcher waits for the other ranks' acks
    attach_timeout_s: float = 60.0  # how long a rank waits for the dispatcher it attaches to
    credit_budget_mb: float = 1024.0  # batches this rank may have in flight or waiting, in all, in MB

    def check_exposure(self) -> None:
        """Without keys, refuse to listen beyond loopback unless told to."""
        if self.keys or self.insecure:
            return
        for endpoint in (self.data_bind, self.control_bind, f"tcp://{self.metrics_addr}:0"):
            if not is_loopback(endpoint):
                raise ValueError(f"refusing to bind {endpoint} without CURVE keys: anyone who can reach it could "
                                 f"feed or steal batches or read the job's metrics; make keys with `stoker keys init "
                                 f"DIR` and give them (--keys DIR; a Loader: keys=DIR or $STOKER_KEYS=DIR), or allow "
                                 f"it on a trusted network (--insecure; a Loader: insecure=True or "
                                 f"$STOKER_INSECURE=1)")
