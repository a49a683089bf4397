"""A rank put together in named phases, each a value the next one reads (accel.consumer holds the result):

1. identity: who the rank is to the job (its rank, a consumer id, its key or the secret it was handed);
2. join: the job it serves (given, or its dispatcher's) and where it resumes;
3. data: the manifest it reads, the step it runs, the epoch plan and the position it starts from;
4. wiring: the parts that move batches: the dispatcher link, the books (ledger, stream order) and the
   event loop that owns the data socket;
5. at start, with --fleet: the job's seat in the fleet.

One phase per function keeps a reader's path through a rank's start short, and each phase testable alone.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from stoker.accel import checkpoint
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.fleet_member import FleetMembership, join_fleet
from stoker.accel.control.link import DispatcherLink
from stoker.accel.control.local import InProcessDispatcher
from stoker.accel.joining import Joined, LinkServices, Member, dispatcher_for, join
from stoker.accel.ledger import Ledger
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.optional import require
from stoker.accel.receive_loop import DataSocket, ReceiveLoop
from stoker.accel.schema import batch_bytes, schema_of
from stoker.accel.stepping import NullAccelerator, Step, StepFactory, given
from stoker.accel.stream import StreamOrder
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import TOKENS
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import planned_batches, unit_lengths
from stoker.pipeline.text.token_shards import lengths_of
from stoker.pipeline.units import Unit
from stoker.protos.curve import CONSUMER, ClientKeys, ServerKeys
from stoker.protos.leases import LeaseSigner
from stoker.protos.sd_notify import Notifier


def identify(cfg: ConsumerConfig, rank: int, credential: bytes | None) -> Member:
    """Phase 1: who this rank is to its job."""
    consumer_id = f"rank{rank}-{os.getpid()}-{secrets.token_hex(3)}"
    client_keys = ClientKeys.load(cfg.keys, cfg.key_name, CONSUMER) if cfg.keys and cfg.dispatcher else None
    return Member(rank, consumer_id, client_keys, credential)


def join_job(cfg: ConsumerConfig, job: JobConfig | None, me: Member, world_size: int | None,
             resume: dict | None) -> tuple[Joined, checkpoint.Position | None]:
    """Phase 2: the job (given, or the dispatcher's) and, resumed, the position its checkpoint saved."""
    joined = join(cfg, job, me, world_size)
    if resume is None:
        return joined, None
    resumed, position = checkpoint.resume(joined.job, resume)
    return replace(joined, job=resumed), position


@dataclass(frozen=True)
class RankData:
    """Phase 3's result: what the rank reads and steps, and where it starts."""

    manifest: Manifest
    step: Step
    plan: EpochPlan
    start: checkpoint.Position


def load_data(job: JobConfig, make_step: StepFactory | None, position: checkpoint.Position | None) -> RankData:
    """Phase 3: the manifest (checked against the job and its files), the step made for the job, the plan,
    and the start position (a resumed one checked against the plan)."""
    manifest = Manifest.load(job.manifest_uri)
    job.check_fits(manifest)
    manifest.check_shard_files()
    if job.decode_on == DecodeOn.ACCELERATOR:
        require("nvidia.dali", "--decode-on accelerator")
    step = (make_step or given(NullAccelerator()))(job, manifest)
    plan = job.plan(manifest)
    if position is not None:
        position.check(plan, job.planned_batches if job.kind.one_row_per_sample else None)
        position = past_epoch_end(position, job, plan)
    return RankData(manifest, step, plan, position or checkpoint.Position(0, 0, [(0, 0)] * job.world_size))


def image_epoch_steps(job: JobConfig, plan: EpochPlan, epoch: int) -> int:
    """An image epoch's steps on every rank, from the plan alone: the longest rank stream."""
    return PlannedSteps(plan, job.sample_batches).of(epoch)


@dataclass
class PlannedSteps:
    """Every rank's steps of an epoch from the plan alone, the longest rank stream's batches (each unit's
    from `batches_of`), worked out once per epoch."""

    plan: EpochPlan
    batches_of: Callable[[Unit], int]
    known: dict[int, int] = field(default_factory=dict)

    def of(self, epoch: int) -> int:
        if epoch not in self.known:
            self.known[epoch] = self.plan.step_offset(epoch) + max(
                sum(self.batches_of(u) for u in self.plan.rank_units(epoch, r)) for r in range(self.plan.world_size))
        return self.known[epoch]


def planned_steps(job: JobConfig, manifest: Manifest, plan: EpochPlan) -> PlannedSteps | None:
    """Images: a unit's batches follow from its size; tokens: from its documents' token counts in its
    visiting order (pipeline.text.lm_layout); None for BERT text, whose batches are known once made."""
    if job.kind.one_row_per_sample:
        return PlannedSteps(plan, job.sample_batches)
    if job.dataset != TOKENS.name:
        return None
    lengths = lengths_of(manifest)
    return PlannedSteps(plan, lambda unit: planned_batches(unit_lengths(unit, job.seed, lengths), job.lm,
                                                           job.batch_size) - unit.skip)


def past_epoch_end(position: checkpoint.Position, job: JobConfig, plan: EpochPlan) -> checkpoint.Position:
    """A position after an image epoch's last step (a checkpoint of an older Stoker, saved before the
    epoch's end was seen) is the next epoch's start."""
    epoch = position.epoch
    if epoch < job.epochs and job.kind.one_row_per_sample and position.step >= image_epoch_steps(job, plan, epoch):
        return checkpoint.Position(epoch + 1, 0, [(0, 0)] * job.world_size)
    return position


@dataclass(frozen=True)
class Wiring:
    """Phase 4's result: the parts that move the rank's batches."""

    leases: LeaseSigner
    dispatcher: DispatcherLink
    ledger: Ledger
    order: StreamOrder
    systemd: Notifier
    loop: ReceiveLoop


def credit_budget(cfg: ConsumerConfig, job: JobConfig) -> int:
    """Batches the rank may hold in all (in flight or waiting here), from its byte budget."""
    nbytes = max(1, batch_bytes(job))
    return max(2 * cfg.credit_window, int(cfg.credit_budget_mb * (1 << 20)) // nbytes)


def counted_at_epoch_end(job: JobConfig) -> bool:
    """A BERT job of several ranks: its epoch's steps are settled only once every rank has received its whole
    stream and said how many batches it holds (Consumer.steps_of; planned_steps says why)."""
    return not job.kind.one_row_per_sample and job.dataset != TOKENS.name and job.world_size > 1


def wire(cfg: ConsumerConfig, joined: Joined, data: RankData, me: Member, metrics: ConsumerMetrics,
         on_job_failed: Callable[[str], None]) -> Wiring:
    """Phase 4: the dispatcher link (in-process on rank 0, else attached), the books restored from the
    start position, and the event loop over the data socket."""
    job, plan, start = joined.job, data.plan, data.start
    leases = LeaseSigner(joined.lease_key, job.job_id) if joined.lease_key else LeaseSigner.new(job.job_id)
    server_keys = ServerKeys.load(cfg.keys) if cfg.keys else None
    count_release = lambda reason, units: metrics.releases.labels(reason=reason).inc(units)  # noqa: E731
    dispatcher = dispatcher_for(cfg, joined, plan, start, me, LinkServices(metrics, leases, count_release,
                                                                           server_keys))
    ledger = Ledger(plan, me.rank)
    ledger.restore(set(start.done_units(plan)))
    units, replay = start.ranks[me.rank]
    order = StreamOrder(plan, me.rank, start.epoch, units, released=start.step - replay)
    systemd = Notifier()  # Type=notify units: ready once bound, watchdog fed by the event loop
    budget = credit_budget(cfg, job)
    data_socket = DataSocket(cfg.data_bind, cfg.advertise_host, server_keys, cfg.credit_window, budget,
                             cfg.sender_timeout_s, steps_wait_on_stream=counted_at_epoch_end(job))
    loop = ReceiveLoop(job.job_id, data_socket, schema_of(job), ledger, order, leases, metrics, dispatcher,
                       on_job_failed, systemd)
    return Wiring(leases, dispatcher, ledger, order, systemd, loop)


def join_fleet_of(cfg: ConsumerConfig, job: JobConfig, link: DispatcherLink) -> FleetMembership | None:
    """At start, with --fleet: the rank that runs the job's dispatcher registers the job (it fails here,
    when no fleet answers) and beats what its ranks measure. None for every other rank, and without one."""
    if not cfg.seat.fleet or not isinstance(link, InProcessDispatcher) or link.server is None:
        return None
    membership = join_fleet(cfg.seat, job, link.control_endpoint, link.server.job_need, cfg.keys)
    if membership is None:
        return None
    membership.join()
    membership.start()
    return membership
