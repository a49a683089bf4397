"""The dispatcher: owns the epoch plan, leases work units, takes acks, re-leases lost work.

Pure state, no sockets: `control_server` maps control messages onto it, and the consumer calls
`ack` directly when it runs in the same process. A small facade over parts, each I/O-free with
one job and reached by name where a caller needs only it: `queue` (the units waiting, in lease
order), `leases` (who holds what), `progress` (what is done, and where every rank's stream
stands), `liveness` (which hosts and ranks are alive) and `poison` (samples that kill their
process). This module holds only the rules that join them: a lease made durable before it is
answered, a lost host's units back at their place, a new consumer's rank rewound, an ack that
closes an epoch compacting the journal. It holds what the open epochs need, not the whole job.
Units are handed out position by position across the data-parallel ranks, each only once its
rank has attached (a unit's batches go to its rank's data socket).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stoker.accel.control.journal import Journal
from stoker.accel.control.lease_table import AVOID_S, Lease, LeaseTable
from stoker.accel.control.liveness import Liveness, RankError
from stoker.accel.control.poison import PoisonList
from stoker.accel.control.progress import Progress
from stoker.accel.control.unit_queue import UnitQueue, lease_key
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.units import Unit
from stoker.protos.leases import HANDED_BACK, SHORT_UNIT, TRADED, UNREACHABLE, release_label

__all__ = ["Dispatcher", "DispatcherStats", "Lease", "RankError"]


@dataclass
class DispatcherStats:
    pending: int
    leased: int
    done: int
    hosts_alive: int
    releases: int  # units taken from a lost host or a stale lease and leased again
    handed_back: int = 0  # units a worker process gave back, traded for an earlier one or unsendable (nothing lost)
    failure: str = ""  # why the job failed (a worker refused it); "" while it goes on
    stall: str = ""  # which rank waits for a batch, and who holds what it waits for (accel.control.watchdog)
    hung_samples: int = 0  # samples whose transform ran past --transform-timeout (skipped from then on)
    hung_s: float = 0.0  # the seconds worker processes spent in those calls (the bottleneck's `transform`)


@dataclass
class Dispatcher:
    plan: EpochPlan
    host_timeout_s: float = 10.0
    lease_timeout_s: float = 600.0  # a lease older than this is handed out again even if its host lives
    clock: Callable[[], float] = time.monotonic
    on_release: Callable[[str, int], None] | None = None  # (reason, units) for metrics
    done_before: frozenset[int] = frozenset()  # units a previous run completed (resume)
    journal: Journal | None = None  # every lease/ack/release is made durable before it is answered
    planned_batches: Callable[[Unit], int | None] | None = None  # images: a unit's batches follow from its size
    total_units: int = field(init=False)
    failure: str = field(init=False, default="")  # the first refusal: the job is over, not finished
    stall: str = field(init=False, default="")  # the stall watchdog's line while a rank waits (control.serving)
    leases: LeaseTable = field(init=False, default_factory=LeaseTable)
    _received: dict[int, Unit] = field(init=False, default_factory=dict)  # all batches at their rank, not yet acked
    _started: dict[int, str] = field(init=False, default_factory=dict)  # rank -> the consumer whose start position
    # was applied (rewind_rank): its re-attaches, after a reconnect, change nothing
    poison: PoisonList = field(init=False, default_factory=PoisonList)  # samples that kill their process
    _releases: int = field(init=False, default=0)
    _handed_back: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.total_units = self.plan.total_units
        replayed = self.journal.replayed if self.journal else None
        self.liveness = Liveness(self.plan.world_size, self.host_timeout_s, self.clock)
        self.progress = Progress(self.plan, self.planned_batches, replayed.done_below if replayed else 0)
        if replayed:
            self.progress.remember_batches(replayed.batches)
        for unit_id in set(self.done_before) | (replayed.done if replayed else set()):
            self.progress.mark_done(unit_id)
        now = self.clock()
        for unit_id, (host, worker, request_id, key) in (replayed.leases if replayed else {}).items():
            unit = self.plan.unit(unit_id)  # leases from before a restart stay with their hosts for one host timeout
            if unit is not None and not self.progress.is_done(unit_id):
                self.leases.hold(Lease(unit, host, worker, now, request_id, key))
                self.liveness.known(host)
        self.progress.close_done_epochs()
        per_epoch = self.plan.units_per_epoch
        self.queue = UnitQueue(self.plan, self.progress.is_done, self._is_out,
                               loaded=self.progress.done_below // per_epoch if per_epoch else 0)
        self.queue.fill()

    def _is_out(self, unit_id: int) -> bool:
        return unit_id in self.leases or unit_id in self._received

    # ---- hosts and ranks --------------------------------------------------------------
    def expire_hosts(self) -> list[str]:
        """Declare hosts silent for longer than host_timeout_s dead; re-lease their units. A live
        host whose process hangs must not hold a unit for ever either: a lease older than
        lease_timeout_s is redone (safe: the consumer drops whichever copy of a batch comes second)."""
        dead = self.liveness.expired_hosts()
        for host in dead:
            self.release(host, None, "host_timeout")
        for lease in self.leases.older_than(self.clock() - self.lease_timeout_s):
            self.release(lease.host_id, [lease.worker_id], "lease_expired")
        return dead

    # ---- ranks -------------------------------------------------------------------------
    def attach_rank(self, rank: int, data_endpoint: str, consumer_id: str = "", world_size: int = 0) -> None:
        """A rank's data socket: its units can be leased from now on. A rank held by another live
        consumer (heard from within the host timeout), a rank outside the job or another world
        size is refused with the reason (RankError).

        A new consumer for the rank: what the old one held is gone, and so are the leases made for
        it. A worker process that sent a unit's last batch to the old consumer holds that unit no
        more, and the old consumer will never say it arrived: kept, its lease would sit until
        lease_timeout_s, the unit neither pending nor done, and the new consumer would starve on it.
        A process still making such a unit for the old address hands it back anyway (UNREACHABLE);
        one that asks with it in `holding` is not held to it (LeaseTable.held_per_rank)."""
        if self.liveness.claim_rank(rank, consumer_id, world_size):
            for unit in [u for u in self._received.values() if u.rank == rank]:
                del self._received[unit.unit_id]
                self.queue.requeue(unit)
            for lease in self.leases.of_rank(rank):
                self.release(lease.host_id, [lease.worker_id], UNREACHABLE, [lease.unit.unit_id], lease.key)
        self.liveness.set_endpoint(rank, data_endpoint)

    def rewind_rank(self, rank: int, consumer_id: str, epoch: int, step: int, units: int, batches: int) -> int:
        """A new consumer of `rank` starts at `step` of `epoch`, having consumed its stream's first
        `units` units of that epoch and `batches` batches after them (its checkpoint; (0, 0, 0, 0)
        without one). Whatever of that rank's stream is done here past that point was stepped by a
        consumer whose steps are lost (it crashed after its last checkpoint): it goes back to the
        queue, so the rank gets it again, in order; whatever before it is not done here counts done
        (the consumer before stepped it and died before its ack came). Applied once per consumer (a
        re-attach after a reconnect changes nothing). Returns the units put back. RankError when that
        would need the batch counts of text units of epochs this dispatcher no longer keeps."""
        if self._started.get(rank) == consumer_id:
            return 0
        per, undone = self.plan.units_per_epoch, 0
        if per and epoch < self.plan.epochs:
            done_below = self.progress.done_below
            if done_below > (epoch + 1) * per and self.planned_batches is None:
                raise RankError(f"rank {rank} starts in epoch {epoch}, but this dispatcher has finished epoch "
                                f"{done_below // per - 1} and no longer knows the batch counts of text units "
                                f"before it: start the dispatcher again without its journal to continue from the "
                                f"checkpoint")
            undone = self.progress.undo_rank(epoch, rank, units)
            self.progress.start_at(epoch, rank, units, step - batches)
            if undone:
                self.queue.reload_from(epoch)
        if per:
            for unit_id in self._consumed_not_acked(rank, epoch, units):
                self.ack(unit_id)
        self._started[rank] = consumer_id
        if undone and self.journal is not None:
            self.journal.compact(self.snapshot())  # the journal has no event that undoes an ack
        return undone

    def _consumed_not_acked(self, rank: int, epoch: int, units: int) -> list[int]:
        """The units of `rank`'s stream before a new consumer's start that are not done here: the consumer
        before it stepped (committed) them all, and died before its ack of the last came. They count as done
        now, as its ack would have made them; left open, the unit would be leased again for a rank that
        never asks for it (its start is past it), the job one unit short of finished for ever."""
        per = self.plan.units_per_epoch
        out = []
        for e in range(self.progress.done_below // per, min(epoch + 1, self.plan.epochs)):
            stream = self.plan.rank_units(e, rank)
            out += [u.unit_id for u in (stream[:units] if e == epoch else stream)
                    if not self.progress.is_done(u.unit_id)]
        return out

    # ---- units -------------------------------------------------------------------------
    def lease(self, host_id: str, worker_id: str, request_id: int = 0, key: str = "",
              holding: Iterable[int] = ()) -> Unit | None:
        """The next unit for this worker process, or None when it should wait.

        A process holds at most one lease per rank and sends their batches in step order, so a
        rank that waits, in lock-step, for another rank's batch never keeps the process from
        making that batch (workers.process). `holding`: the units the process still works on. It
        is given the earliest pending unit of a rank it holds none of; or, when a rank's earliest
        pending unit comes before the one the process holds of that rank (that unit was handed
        back after the process took the later one), that unit in exchange for the held one,
        which goes back to the queue (TRADED: nothing lost). So the unit the slowest rank needs
        next is never stuck behind leases of later units.

        A worker repeats a request whose answer it did not get. When the dispatcher died between
        journaling a lease and answering, the repeat reaches a restarted dispatcher that has no
        reply cache: it must get the same unit, or that unit would stay leased to a worker that
        never heard of it until the lease expired."""
        self.liveness.heartbeat(host_id)
        if request_id:
            again = self.leases.answered(worker_id, request_id, key)
            if again is not None:
                return again
        held = self.leases.held_per_rank(holding, host_id, worker_id, key, self.plan.world_size)
        now, hosts = self.clock(), len(self.liveness.live_hosts())
        unit = self.queue.take(lambda unit: self.liveness.attached(unit.rank)
                                and (unit.rank not in held or lease_key(unit) < lease_key(held[unit.rank]))
                                and not self.leases.avoided(unit.unit_id, host_id, now, hosts))
        if unit is None:
            return None
        if unit.rank in held:
            self.release(host_id, [worker_id], TRADED, [held[unit.rank].unit_id], key)
        if self.journal:
            self.journal.lease(unit.unit_id, host_id, worker_id, request_id, key)
        self.leases.hold(Lease(unit, host_id, worker_id, self.clock(), request_id, key))
        self.queue.make_ahead()
        return unit

    def redo(self, unit_id: int) -> bool:
        """The unit's rank got a last batch from its leaseholder that left samples of it out: lease it
        again, to another host when one asks within AVOID_S (SHORT_UNIT). True if it was leased."""
        lease = self.leases.get(unit_id)
        if lease is None or self.progress.is_done(unit_id):
            return False
        self.leases.avoid(unit_id, lease.host_id, self.clock() + AVOID_S)
        return self.release(lease.host_id, [lease.worker_id], SHORT_UNIT, [unit_id]) > 0

    def received(self, unit_id: int) -> None:
        """Every batch of the unit is at its rank: its lease is over, and no lost host makes it redone."""
        lease = self.leases.let_go(unit_id)
        if lease is not None and not self.progress.is_done(unit_id):
            self._received[unit_id] = lease.unit

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        """The consumer has stepped every batch of the unit (`batches` of them); True the first time."""
        if self.plan.unit(unit_id) is None or self.progress.is_done(unit_id):
            return False
        if self.journal:
            self.journal.ack(unit_id, batches)
        self.progress.mark_done(unit_id, batches)
        self.leases.let_go(unit_id)
        self._received.pop(unit_id, None)
        self.queue.forget(unit_id)
        if self.progress.close_done_epochs() and self.journal:
            self.journal.compact(self.snapshot())
        return True

    def snapshot(self) -> dict:
        """What a restart needs, in place of the history that led to it (journal compaction)."""
        return {**self.progress.snapshot(), "leases": self.leases.snapshot()}

    def release(self, host_id: str, worker_ids: Iterable[str] | None, reason: str,
                unit_ids: Iterable[int] | None = None, key: str | None = None) -> int:
        """Put a host's (or some of its workers') unacked units back in the queue, at their place in the
        lease order: the earliest unit is always the next one handed out. `key`: only the leases made
        to that CURVE key (a worker's release; with keys nobody gives back another key's units)."""
        lost = self.leases.matching(host_id, worker_ids, unit_ids, key)
        if not lost:
            return 0
        if self.journal:
            self.journal.release([lease.unit.unit_id for lease in lost])
        for lease in sorted(lost, key=lambda item: item.leased_at, reverse=True):
            self.leases.let_go(lease.unit.unit_id)
            self.queue.requeue(lease.unit)
        if reason in HANDED_BACK:
            self._handed_back += len(lost)
        else:
            self._releases += len(lost)
        if self.on_release:  # a metric's label: a closed set, whatever a peer wrote
            self.on_release(release_label(reason), len(lost))
        return len(lost)

    # ---- the job as a whole ------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.progress.finished

    def rank_finished(self, rank: int) -> bool:
        """Whether the rank's stream is done: the last unit of its last epoch with units is (a rank acks its units
        in stream order, so a rank gone quiet after it waits for nothing)."""
        for epoch in reversed(range(self.plan.epochs)):
            units = self.plan.rank_units(epoch, rank)
            if units:
                return self.progress.is_done(units[-1].unit_id)
        return True

    def fail(self, reason: str) -> bool:
        """A worker refused the job (it cannot run it as pinned): the job is over. True the first time."""
        if self.failure or self.finished:
            return False
        self.failure = reason
        return True

    @property
    def over(self) -> bool:
        """Nothing more will be leased: every unit is done, or the job failed."""
        return self.finished or bool(self.failure)

    def stats(self) -> DispatcherStats:
        done = self.progress.done_count
        in_flight = len(self.leases) + len(self._received)
        return DispatcherStats(self.total_units - done - in_flight, in_flight, done,
                               len(self.liveness.live_hosts()), self._releases, self._handed_back, self.failure,
                               self.stall, self.poison.hung_samples, self.poison.hung_s)
