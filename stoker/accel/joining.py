"""How a rank comes to its job and to the job's dispatcher.

Rank 0 is given the job and runs the dispatcher in its process (accel.control.local) unless
`ConsumerConfig.dispatcher` names one elsewhere; every other rank takes the job from that
dispatcher (`stoker dispatch`, or rank 0's) and stays linked to it (accel.control.remote).
Without CURVE keys a rank proves itself to a dispatcher elsewhere with the job secret, which
rank 0 may still be writing when the rank starts (protos.job_secret).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from stoker.accel import checkpoint
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.link import DispatcherLink
from stoker.accel.control.local import Closing, ControlSocket, InProcessDispatcher
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.remote import NotAConsumer, RankRefused, RemoteDispatcher, attach
from stoker.accel.control.serving.server import AccessPolicy
from stoker.accel.control.watchdog import StallBounds
from stoker.pipeline.job import JobConfig
from stoker.pipeline.job_wire import job_from_proto, job_to_proto
from stoker.pipeline.plan import EpochPlan
from stoker.protos import job_secret
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys, ServerKeys
from stoker.protos.errors import ConfigError
from stoker.protos.leases import LeaseSigner

SECRET_WAIT_S = 30.0  # the longest a rank waits for rank 0's job secret file


@dataclass(frozen=True)
class Member:
    """Who a rank is to the job: its rank, its consumer id, its key or the secret it was handed."""

    rank: int
    consumer_id: str
    client_keys: ClientKeys | None = None  # with CURVE keys and a dispatcher elsewhere
    given_credential: bytes | None = None  # the job secret, when the ranks shared it themselves (accel.ranks)


@dataclass(frozen=True)
class Joined:
    job: JobConfig
    lease_key: bytes  # the dispatcher's key for lease tokens (b"": this rank makes one)
    credential: bytes  # what this rank proves itself with to a dispatcher elsewhere (b"" with keys)


def join(cfg: ConsumerConfig, job: JobConfig | None, me: Member, world_size: int | None) -> Joined:
    """The job this rank serves (given, or the dispatcher's), its lease key and this rank's credential."""
    lease_key = credential = b""
    if cfg.dispatcher:
        if job is not None:
            raise ConfigError("with a separate dispatcher the job is the dispatcher's; do not pass one")
        spec, lease_key, credential = _attach(cfg, me, world_size or 0)
        job = job_from_proto(spec)
    elif job is not None:
        job = job.pin()  # this rank serves the job: its transform's version is pinned here
    if job is None:
        raise ConfigError("give the job, or a dispatcher to take it from (ConsumerConfig.dispatcher)")
    if world_size is not None and world_size != job.world_size:
        if cfg.dispatcher:
            raise RankRefused(f"the job has world size {job.world_size}, not {world_size}")
        job = replace(job, world_size=world_size)
    if not 0 <= me.rank < job.world_size:
        raise RankRefused(f"rank {me.rank} is outside the job's ranks 0..{job.world_size - 1}")
    return Joined(job, lease_key, credential)


def _attach(cfg: ConsumerConfig, me: Member, world_size: int) -> tuple[pb.JobSpec, bytes, bytes]:
    """The job from the dispatcher. Without keys a rank proves itself with the job secret, which
    rank 0 may still be writing: a refusal is retried for a while with the secret read again."""
    assert cfg.dispatcher is not None
    deadline = time.monotonic() + min(SECRET_WAIT_S, cfg.attach_timeout_s)
    given = me.given_credential
    while True:
        credential = b"" if cfg.keys else given or _read_secret(cfg.job_secret, cfg.dispatcher, deadline)
        try:
            spec, lease_key = attach(cfg.dispatcher, me.consumer_id, me.client_keys, credential, rank=me.rank,
                                     world_size=world_size, timeout_s=cfg.attach_timeout_s)
            return spec, lease_key, credential
        except NotAConsumer:
            if cfg.keys or given or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_secret(path: str | None, dispatcher: str, deadline: float) -> bytes:
    """The job secret from $STOKER_JOB_SECRET or rank 0's file (`path`, else the one for `dispatcher`),
    waiting (until `deadline`) while the file is not there yet or is being replaced."""
    while True:
        try:
            return job_secret.for_consumer(path, dispatcher,
                                           wait_s=max(0.0, deadline - time.monotonic()))
        except job_secret.UntrustedSecret:
            raise  # planted or open to others: waiting would not make it ours
        except job_secret.JobSecretError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class LinkServices:
    """What a dispatcher in this process reports to, signs leases with and serves its socket with."""

    metrics: ControlMetrics
    leases: LeaseSigner
    on_release: Callable[[str, int], None]  # (reason, units) it took back from lost hosts or stale leases
    server_keys: ServerKeys | None  # CURVE: the server key pair and allow-lists


def dispatcher_for(cfg: ConsumerConfig, joined: Joined, plan: EpochPlan, start: checkpoint.Position,
                   me: Member, services: LinkServices) -> DispatcherLink:
    """Rank 0 runs the dispatcher in-process unless told to attach to one; other ranks attach."""
    job = joined.job
    done = start.done_units(plan)
    if cfg.dispatcher:
        return RemoteDispatcher(cfg.dispatcher, me.consumer_id, plan.rank_total_units(me.rank), me.client_keys,
                                joined.credential, done_before=done, rank=me.rank, world_size=job.world_size,
                                linger_s=cfg.finish_linger_s, start=_start_of(start, me.rank),
                                give_up_s=cfg.stall_timeout_s)
    if me.rank != 0:
        raise RankRefused(f"rank {me.rank} attaches to rank 0's dispatcher: give its endpoint (--dispatcher)")
    dispatcher = Dispatcher(plan, cfg.host_timeout_s, cfg.lease_timeout_s, on_release=services.on_release,
                            done_before=done,
                            planned_batches=job.planned_batches if job.kind.one_row_per_sample else None)
    dispatcher.progress.resume_position(start.epoch, start.ranks, start.step)
    consumer_secret = None
    if job.world_size > 1 and not cfg.keys:  # the other ranks attach with the job secret
        consumer_secret = me.given_credential or job_secret.for_rank_zero(cfg.job_secret, cfg.control_bind)
    keys = services.server_keys
    access = AccessPolicy(keyed=keys is not None, consumer_secret=consumer_secret,
                          remote_consumers=job.world_size > 1)
    return InProcessDispatcher(dispatcher, ControlSocket(cfg.control_bind, cfg.advertise_host, keys, access),
                               functools.partial(job_to_proto, job), services.metrics, services.leases, me.consumer_id,
                               Closing(rank_wait_s=cfg.rank_wait_s, linger_s=cfg.finish_linger_s),
                               StallBounds(cfg.stall_report_s, cfg.stall_timeout_s))


def _start_of(start: checkpoint.Position, rank: int) -> pb.StartPosition:
    """Where `rank` starts its stream, as the dispatcher is told when the rank attaches."""
    units, batches = start.ranks[rank] if rank < len(start.ranks) else (0, 0)
    return pb.StartPosition(epoch=start.epoch, step=start.step, units=units, batches=batches)
