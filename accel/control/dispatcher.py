"""The dispatcher: owns the epoch plan, leases work units, takes acks, re-leases lost work.

Pure state, no sockets: `control_server` maps control messages onto these methods, and the
consumer calls `ack` directly when it runs in the same process. Units are handed out
position by position across the data-parallel ranks (`EpochPlan.lease_order`), each only once
its rank has attached (a unit's batches go to its rank's data socket). The dispatcher also
keeps what every rank's stream has given so far, in batches per unit, so that it can say how
many steps an epoch has on every rank and where every rank stands after a step.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from accel.control.journal import Journal
from pipeline.plan import EpochPlan, Unit
from protos.leases import STARVED


@dataclass
class Lease:
    unit: Unit
    host_id: str
    worker_id: str
    leased_at: float
    request_id: int = 0  # the worker's request that got it: a retry of that request gets this unit again
    key: str = ""  # the CURVE key it was leased to ("" without keys): only that key's retry gets it again


class RankError(ValueError):
    """A consumer rank that cannot join the job as it asked."""


@dataclass
class DispatcherStats:
    pending: int
    leased: int
    done: int
    hosts_alive: int
    releases: int  # units taken from a lost host or a stale lease and leased again
    handed_back: int = 0  # units a worker process gave back while it waited for credit (nothing lost)


@dataclass
class Dispatcher:
    plan: EpochPlan
    host_timeout_s: float = 10.0
    lease_timeout_s: float = 600.0  # a lease older than this is handed out again even if its host lives
    clock: Callable[[], float] = time.monotonic
    on_release: Callable[[str, int], None] | None = None  # (reason, units) for metrics
    done_before: frozenset[int] = frozenset()  # units a previous run completed (resume)
    journal: Journal | None = None  # every lease/ack/release is made durable before it is answered
    planned_batches: Callable[[Unit], int] | None = None  # images: a unit's batches follow from its size
    _pending: list[tuple[int, int, Unit]] = field(init=False)  # a heap in lease order; may hold acked units
    _order: dict[int, int] = field(init=False, default_factory=dict)  # unit -> its place in the lease order
    _pending_ids: set[int] = field(init=False, default_factory=set)
    _leased: dict[int, Lease] = field(init=False, default_factory=dict)
    _done: set[int] = field(init=False, default_factory=set)
    _hosts: dict[str, float] = field(init=False, default_factory=dict)
    _releases: int = field(init=False, default=0)
    _handed_back: int = field(init=False, default=0)
    _known: set[int] = field(init=False, default_factory=set)
    _endpoints: dict[int, str] = field(init=False, default_factory=dict)  # rank -> its data socket
    _ranks: dict[int, tuple[str, float]] = field(init=False, default_factory=dict)  # rank -> (consumer, last heard)
    _prefix: dict[tuple[int, int], tuple[int, int]] = field(init=False, default_factory=dict)  # (epoch, rank) ->
    # (units, batches) a resumed job starts from: those units' counts are not known one by one
    _batches: dict[int, int] = field(init=False, default_factory=dict)  # unit -> batches it gave (acked)
    _received: dict[int, Unit] = field(init=False, default_factory=dict)  # all batches at their rank, not yet acked
    _stream_batches: dict[int, dict[int, int]] = field(init=False, default_factory=dict)  # epoch -> rank -> batches
    total_units: int = field(init=False)

    def __post_init__(self) -> None:
        units = [u for epoch in range(self.plan.epochs) for u in self.plan.lease_order(epoch)]
        replayed = self.journal.replayed if self.journal else None
        done = set(self.done_before) | (replayed.done if replayed else set())
        if replayed:
            self._batches.update(replayed.batches)
        open_leases = replayed.leases if replayed else {}
        self._done = {u.unit_id for u in units if u.unit_id in done}
        now = self.clock()
        for unit in units:  # leases from before a restart stay with their hosts for one host timeout
            if unit.unit_id in open_leases and unit.unit_id not in self._done:
                host, worker, request_id, key = open_leases[unit.unit_id]
                self._leased[unit.unit_id] = Lease(unit, host, worker, now, request_id, key)
                self._hosts.setdefault(host, now)
        self._order = {u.unit_id: i for i, u in enumerate(units)}
        self._pending = [(self._order[u.unit_id], u.unit_id, u) for u in units
                         if u.unit_id not in self._done and u.unit_id not in self._leased]  # sorted: a heap already
        self._pending_ids = {u.unit_id for _, _, u in self._pending}
        self.total_units = len(units)
        self._known = {u.unit_id for u in units}

    # ---- hosts -------------------------------------------------------------------------
    def heartbeat(self, host_id: str) -> None:
        """Registration and heartbeats both mark a host alive."""
        self._hosts[host_id] = self.clock()

    def live_hosts(self) -> list[str]:
        return list(self._hosts)

    def expire_hosts(self) -> list[str]:
        """Declare hosts silent for longer than host_timeout_s dead; re-lease their units."""
        now = self.clock()
        dead = [h for h, seen in self._hosts.items() if now - seen > self.host_timeout_s]
        for host in dead:
            del self._hosts[host]
            self.release(host, None, "host_timeout")
        self._expire_leases(now)
        return dead

    def _expire_leases(self, now: float) -> None:
        """A live host whose process hangs must not hold a unit forever; redoing it is safe
        (the consumer drops whichever copy of a batch arrives second)."""
        stale = [lease for lease in self._leased.values() if now - lease.leased_at > self.lease_timeout_s]
        for lease in stale:
            self.release(lease.host_id, [lease.worker_id], "lease_expired")

    # ---- ranks -------------------------------------------------------------------------
    def attach_rank(self, rank: int, data_endpoint: str, consumer_id: str = "", world_size: int = 0) -> None:
        """A rank's data socket: its units can be leased from now on. A rank held by another live
        consumer (heard from within the host timeout), a rank outside the job or another world
        size is refused with the reason (RankError)."""
        size = self.plan.world_size
        if world_size and world_size != size:
            raise RankError(f"this job has world size {size}, not {world_size}")
        if not 0 <= rank < size:
            raise RankError(f"rank {rank} is outside the job's ranks 0..{size - 1}")
        now = self.clock()
        owner = self._ranks.get(rank)
        if owner and owner[0] != consumer_id and now - owner[1] <= self.host_timeout_s:
            raise RankError(f"rank {rank} is already taken by consumer {owner[0]!r}, heard from "
                            f"{now - owner[1]:.1f} s ago")
        if owner and owner[0] != consumer_id:  # a new consumer for the rank: what the old one held is gone
            for unit in [u for u in self._received.values() if u.rank == rank]:
                del self._received[unit.unit_id]
                self._requeue(unit)
        self._ranks[rank] = (consumer_id, now)
        if data_endpoint:
            self._endpoints[rank] = data_endpoint

    def rank_heard(self, rank: int, consumer_id: str) -> None:
        owner = self._ranks.get(rank)
        if owner and owner[0] == consumer_id:
            self._ranks[rank] = (consumer_id, self.clock())

    def silent_ranks(self) -> list[int]:
        """Attached ranks not heard from for longer than the host timeout."""
        now = self.clock()
        return [rank for rank, (_, seen) in sorted(self._ranks.items()) if now - seen > self.host_timeout_s]

    def resume_position(self, epoch: int, ranks: list[tuple[int, int]], step: int) -> None:
        """A job resumed at `step` of `epoch`: rank r had consumed its first ranks[r][0] units and
        ranks[r][1] batches after them (the counts of those units need not be known one by one)."""
        for rank, (units, batches) in enumerate(ranks):
            self._prefix[(epoch, rank)] = (units, step - batches)

    def endpoint(self, rank: int) -> str | None:
        return self._endpoints.get(rank)

    def batches_of(self, unit: Unit) -> int | None:
        """How many batches a unit gives: from its size (images), or once it has been acked (text)."""
        if self.planned_batches is not None:
            return self.planned_batches(unit)
        return self._batches.get(unit.unit_id)

    def epoch_steps(self, epoch: int, rank: int, batches: int) -> int | None:
        """A rank has received its whole stream of `epoch` (`batches` batches); once every rank
        has, the epoch's steps on every rank: the longest stream."""
        reported = self._stream_batches.setdefault(epoch, {})
        reported[rank] = batches
        return max(reported.values()) if len(reported) == self.plan.world_size else None

    def position(self, epoch: int, step: int) -> list[tuple[int, int]]:
        """Per rank, where its stream stands after `step` steps of `epoch`: (units whose batches are
        all counted, batches consumed after them). A unit whose count is not known yet (its ack is
        on its way) is simply not counted: resuming then replays a few more batches, silently."""
        out = []
        for rank in range(self.plan.world_size):
            index, consumed = self._prefix.get((epoch, rank), (0, 0))
            if consumed > step:
                index, consumed = 0, 0
            for unit in self.plan.rank_units(epoch, rank)[index:]:
                count = self.batches_of(unit)
                if count is None or consumed + count > step:
                    break
                consumed += count
                index += 1
            out.append((index, step - consumed))
        return out

    # ---- units -------------------------------------------------------------------------
    def lease(self, host_id: str, worker_id: str, request_id: int = 0, key: str = "") -> Unit | None:
        """The next unit for this worker, or None when every remaining unit is leased.

        A worker repeats a request whose answer it did not get. When the dispatcher died between
        journaling a lease and answering, the repeat reaches a restarted dispatcher that has no
        reply cache: it must get the same unit, or that unit would stay leased to a worker that
        never heard of it until the lease expired."""
        self._hosts[host_id] = self.clock()
        if request_id:
            for lease in self._leased.values():
                if lease.worker_id == worker_id and lease.request_id == request_id and lease.key == key:
                    return lease.unit
        waiting: list[tuple[int, int, Unit]] = []  # units of ranks that have not attached yet keep their place
        try:
            while self._pending:
                entry = heapq.heappop(self._pending)
                unit = entry[2]
                if unit.unit_id in self._done:
                    self._pending_ids.discard(unit.unit_id)
                    continue
                if unit.rank not in self._endpoints:
                    waiting.append(entry)
                    continue
                self._pending_ids.discard(unit.unit_id)
                if self.journal:
                    self.journal.lease(unit.unit_id, host_id, worker_id, request_id, key)
                self._leased[unit.unit_id] = Lease(unit, host_id, worker_id, self.clock(), request_id, key)
                return unit
            return None
        finally:
            for entry in waiting:
                heapq.heappush(self._pending, entry)

    def received(self, unit_id: int) -> None:
        """Every batch of the unit is at its rank: its lease is over, and no lost host makes it redone."""
        lease = self._leased.pop(unit_id, None)
        if lease is not None and unit_id not in self._done:
            self._received[unit_id] = lease.unit

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        """The consumer has stepped every batch of the unit (`batches` of them); True the first time."""
        if unit_id in self._done or unit_id not in self._known:
            return False
        if batches is not None:
            self._batches[unit_id] = batches
        if self.journal:
            self.journal.ack(unit_id, batches)
        self._done.add(unit_id)
        self._leased.pop(unit_id, None)
        self._received.pop(unit_id, None)
        self._pending_ids.discard(unit_id)
        return True

    def release(self, host_id: str, worker_ids: Iterable[str] | None, reason: str,
                unit_ids: Iterable[int] | None = None) -> int:
        """Put a host's (or some of its workers') unacked units back in the queue, at their place in the
        lease order: the earliest unit is always the next one handed out."""
        wanted = set(worker_ids) if worker_ids else None
        units = set(unit_ids) if unit_ids else None
        lost = [lease for lease in self._leased.values()
                if lease.host_id == host_id and (wanted is None or lease.worker_id in wanted)
                and (units is None or lease.unit.unit_id in units)]
        if lost and self.journal:
            self.journal.release([lease.unit.unit_id for lease in lost])
        for lease in sorted(lost, key=lambda item: item.leased_at, reverse=True):
            del self._leased[lease.unit.unit_id]
            self._requeue(lease.unit)
        if lost and reason == STARVED:
            self._handed_back += len(lost)
        elif lost:
            self._releases += len(lost)
        if lost:
            if self.on_release:
                self.on_release(reason, len(lost))
        return len(lost)

    def _requeue(self, unit: Unit) -> None:
        heapq.heappush(self._pending, (self._order[unit.unit_id], unit.unit_id, unit))
        self._pending_ids.add(unit.unit_id)

    def done_units(self) -> list[int]:
        return sorted(self._done)

    def leases_of(self, host_id: str) -> list[Lease]:
        return [lease for lease in self._leased.values() if lease.host_id == host_id]

    @property
    def finished(self) -> bool:
        return len(self._done) == self.total_units

    def stats(self) -> DispatcherStats:
        return DispatcherStats(len(self._pending_ids), len(self._leased) + len(self._received), len(self._done),
                               len(self._hosts), self._releases, self._handed_back)
