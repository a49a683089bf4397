"""The dispatcher: owns the epoch plan, leases work units, takes acks, re-leases lost work.

Pure state, no sockets: `control_server` maps control messages onto these methods, and the
consumer calls `ack` directly when it runs in the same process. A facade over four parts, each
I/O-free with one job: the units waiting in lease order (unit_queue), the leases held now
(lease_table), what is done and where every rank's stream stands (progress), and who is alive
(liveness); plus the samples that kill their process (poison). This module holds the rules
that join them: a lease made durable before it is answered, a lost host's units back at their
place, an ack that closes an epoch compacting the journal. It holds what the open epochs need,
not the whole job. Units are handed out position by position across the data-parallel ranks,
each only once its rank has attached (a unit's batches go to its rank's data socket).
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
from stoker.pipeline.plan import EpochPlan, Unit
from stoker.protos.leases import HANDED_BACK, SHORT_UNIT, TRADED

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
    stall: str = field(init=False, default="")  # the stall watchdog's line while a rank waits (accel.control.server)
    _leases: LeaseTable = field(init=False, default_factory=LeaseTable)
    _received: dict[int, Unit] = field(init=False, default_factory=dict)  # all batches at their rank, not yet acked
    _started: dict[int, str] = field(init=False, default_factory=dict)  # rank -> the consumer whose start position
    # was applied (rewind_rank): its re-attaches, after a reconnect, change nothing
    _poison: PoisonList = field(init=False, default_factory=PoisonList)
    _releases: int = field(init=False, default=0)
    _handed_back: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.total_units = self.plan.total_units
        replayed = self.journal.replayed if self.journal else None
        self._liveness = Liveness(self.plan.world_size, self.host_timeout_s, self.clock)
        self._progress = Progress(self.plan, self.planned_batches, replayed.done_below if replayed else 0)
        if replayed:
            self._progress.remember_batches(replayed.batches)
        for unit_id in set(self.done_before) | (replayed.done if replayed else set()):
            self._progress.mark_done(unit_id)
        now = self.clock()
        for unit_id, (host, worker, request_id, key) in (replayed.leases if replayed else {}).items():
            unit = self.plan.unit(unit_id)  # leases from before a restart stay with their hosts for one host timeout
            if unit is not None and not self._progress.is_done(unit_id):
                self._leases.hold(Lease(unit, host, worker, now, request_id, key))
                self._liveness.known(host)
        self._progress.close_done_epochs()
        per_epoch = self.plan.units_per_epoch
        self._queue = UnitQueue(self.plan, self._progress.is_done, self._is_out,
                                loaded=self._progress.done_below // per_epoch if per_epoch else 0)
        self._queue.fill()

    def _is_out(self, unit_id: int) -> bool:
        return unit_id in self._leases or unit_id in self._received

    # ---- hosts -------------------------------------------------------------------------
    def heartbeat(self, host_id: str) -> None:
        """Registration and heartbeats both mark a host alive."""
        self._liveness.heartbeat(host_id)

    def live_hosts(self) -> list[str]:
        return self._liveness.live_hosts()

    def expire_hosts(self) -> list[str]:
        """Declare hosts silent for longer than host_timeout_s dead; re-lease their units. A live
        host whose process hangs must not hold a unit for ever either: a lease older than
        lease_timeout_s is redone (safe: the consumer drops whichever copy of a batch comes second)."""
        dead = self._liveness.expired_hosts()
        for host in dead:
            self.release(host, None, "host_timeout")
        for lease in self._leases.older_than(self.clock() - self.lease_timeout_s):
            self.release(lease.host_id, [lease.worker_id], "lease_expired")
        return dead

    # ---- ranks -------------------------------------------------------------------------
    def attach_rank(self, rank: int, data_endpoint: str, consumer_id: str = "", world_size: int = 0) -> None:
        """A rank's data socket: its units can be leased from now on. A rank held by another live
        consumer (heard from within the host timeout), a rank outside the job or another world
        size is refused with the reason (RankError)."""
        if self._liveness.claim_rank(rank, consumer_id, world_size):
            for unit in [u for u in self._received.values() if u.rank == rank]:  # a new consumer for the rank:
                del self._received[unit.unit_id]  # what the old one held is gone
                self._queue.requeue(unit)
        self._liveness.set_endpoint(rank, data_endpoint)

    def rank_heard(self, rank: int, consumer_id: str) -> None:
        self._liveness.rank_heard(rank, consumer_id)

    def silent_ranks(self) -> list[int]:
        """Attached ranks not heard from for longer than the host timeout."""
        return self._liveness.silent_ranks()

    def endpoint(self, rank: int) -> str | None:
        return self._liveness.endpoint(rank)

    def resume_position(self, epoch: int, ranks: list[tuple[int, int]], step: int) -> None:
        """A job resumed at `step` of `epoch` (Progress.resume_position)."""
        self._progress.resume_position(epoch, ranks, step)

    def rewind_rank(self, rank: int, consumer_id: str, epoch: int, step: int, units: int, batches: int) -> int:
        """A new consumer of `rank` starts at `step` of `epoch`, having consumed its stream's first
        `units` units of that epoch and `batches` batches after them (its checkpoint; (0, 0, 0, 0)
        without one). Whatever of that rank's stream is done here past that point was stepped by a
        consumer whose steps are lost (it crashed after its last checkpoint): it goes back to the
        queue, so the rank gets it again, in order. Applied once per consumer (a re-attach after a
        reconnect changes nothing). Returns the units put back. RankError when that would need the
        batch counts of text units of epochs this dispatcher no longer keeps."""
        if self._started.get(rank) == consumer_id:
            return 0
        per = self.plan.units_per_epoch
        if not per or epoch >= self.plan.epochs:
            self._started[rank] = consumer_id
            return 0
        done_below = self._progress.done_below
        if done_below > (epoch + 1) * per and self.planned_batches is None:
            raise RankError(f"rank {rank} starts in epoch {epoch}, but this dispatcher has finished epoch "
                            f"{done_below // per - 1} and no longer knows the batch counts of text units before "
                            f"it: start the dispatcher again without its journal to continue from the checkpoint")
        undone = self._progress.undo_rank(epoch, rank, units)
        self._progress.start_at(epoch, rank, units, step - batches)
        if undone:
            self._queue.reload_from(epoch)
        self._started[rank] = consumer_id
        if undone and self.journal is not None:
            self.journal.compact(self.snapshot())  # the journal has no event that undoes an ack
        return undone

    def batches_of(self, unit: Unit) -> int | None:
        return self._progress.batches_of(unit)

    def epoch_steps(self, epoch: int, rank: int, batches: int) -> int | None:
        return self._progress.epoch_steps(epoch, rank, batches)

    def position(self, epoch: int, step: int) -> list[tuple[int, int]]:
        return self._progress.position(epoch, step)

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
        self._liveness.heartbeat(host_id)
        if request_id:
            again = self._leases.answered(worker_id, request_id, key)
            if again is not None:
                return again
        held = self._leases.held_per_rank(holding, host_id, worker_id, key, self.plan.world_size)
        now, hosts = self.clock(), len(self._liveness.live_hosts())
        unit = self._queue.take(lambda unit: self._liveness.attached(unit.rank)
                                and (unit.rank not in held or lease_key(unit) < lease_key(held[unit.rank]))
                                and not self._leases.avoided(unit.unit_id, host_id, now, hosts))
        if unit is None:
            return None
        if unit.rank in held:
            self.release(host_id, [worker_id], TRADED, [held[unit.rank].unit_id], key)
        if self.journal:
            self.journal.lease(unit.unit_id, host_id, worker_id, request_id, key)
        self._leases.hold(Lease(unit, host_id, worker_id, self.clock(), request_id, key))
        self._queue.make_ahead()
        return unit

    def redo(self, unit_id: int) -> bool:
        """The unit's rank got a last batch from its leaseholder that left samples of it out: lease it
        again, to another host when one asks within AVOID_S (SHORT_UNIT). True if it was leased."""
        lease = self._leases.get(unit_id)
        if lease is None or self._progress.is_done(unit_id):
            return False
        self._leases.avoid(unit_id, lease.host_id, self.clock() + AVOID_S)
        return self.release(lease.host_id, [lease.worker_id], SHORT_UNIT, [unit_id]) > 0

    def received(self, unit_id: int) -> None:
        """Every batch of the unit is at its rank: its lease is over, and no lost host makes it redone."""
        lease = self._leases.let_go(unit_id)
        if lease is not None and not self._progress.is_done(unit_id):
            self._received[unit_id] = lease.unit

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        """The consumer has stepped every batch of the unit (`batches` of them); True the first time."""
        if self.plan.unit(unit_id) is None or self._progress.is_done(unit_id):
            return False
        if self.journal:
            self.journal.ack(unit_id, batches)
        self._progress.mark_done(unit_id, batches)
        self._leases.let_go(unit_id)
        self._received.pop(unit_id, None)
        self._queue.forget(unit_id)
        if self._progress.close_done_epochs() and self.journal:
            self.journal.compact(self.snapshot())
        return True

    def snapshot(self) -> dict:
        """What a restart needs, in place of the history that led to it (journal compaction)."""
        return {**self._progress.snapshot(), "leases": self._leases.snapshot()}

    def release(self, host_id: str, worker_ids: Iterable[str] | None, reason: str,
                unit_ids: Iterable[int] | None = None, key: str | None = None) -> int:
        """Put a host's (or some of its workers') unacked units back in the queue, at their place in the
        lease order: the earliest unit is always the next one handed out. `key`: only the leases made
        to that CURVE key (a worker's release; with keys nobody gives back another key's units)."""
        lost = self._leases.matching(host_id, worker_ids, unit_ids, key)
        if not lost:
            return 0
        if self.journal:
            self.journal.release([lease.unit.unit_id for lease in lost])
        for lease in sorted(lost, key=lambda item: item.leased_at, reverse=True):
            self._leases.let_go(lease.unit.unit_id)
            self._queue.requeue(lease.unit)
        if reason in HANDED_BACK:
            self._handed_back += len(lost)
        else:
            self._releases += len(lost)
        if self.on_release:
            self.on_release(reason, len(lost))
        return len(lost)

    # ---- samples that kill their process ----------------------------------------------------
    def sample_crashed(self, sample_id: int, how: str) -> bool:
        """A worker process died transforming `sample_id`; True when that made it poison (accel.control.poison)."""
        return self._poison.crashed(sample_id, how)

    def skips_of(self, sample_id: int) -> str:
        """Why a poison sample is skipped ("" for one that is not)."""
        return self._poison.why(sample_id)

    def skips_for(self, unit: Unit) -> dict[int, str]:
        """The unit's poison samples, and why each is skipped."""
        return self._poison.in_unit(unit)

    # ---- what holds a rank's stream (the stall watchdog's question) ----------------------------
    def leases_of_rank(self, rank: int) -> list[Lease]:
        """The units of `rank` leased now, in its stream's order."""
        return self._leases.of_rank(rank)

    def open_units_of_rank(self, rank: int) -> tuple[int, Unit | None]:
        """How many of `rank`'s units in the loaded epochs are pending (neither leased nor done), and
        its earliest pending one."""
        return self._queue.open_of_rank(rank)

    # ---- the job as a whole ------------------------------------------------------------------
    def done_units(self) -> list[int]:
        return self._progress.done_units()

    @property
    def finished(self) -> bool:
        return self._progress.finished

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
        done = self._progress.done_count
        in_flight = len(self._leases) + len(self._received)
        return DispatcherStats(self.total_units - done - in_flight, in_flight, done,
                               len(self._liveness.live_hosts()), self._releases, self._handed_back, self.failure,
                               self.stall)
