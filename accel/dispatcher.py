"""The dispatcher: owns the epoch plan, leases work units, takes acks, re-leases lost work.

Pure state, no sockets: `control_server` maps control messages onto these methods, and the
consumer calls `ack` directly when it runs in the same process.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from accel.journal import Journal
from pipeline.plan import EpochPlan, Unit


@dataclass
class Lease:
    unit: Unit
    host_id: str
    worker_id: str
    leased_at: float
    request_id: int = 0  # the worker's request that got it: a retry of that request gets this unit again
    key: str = ""  # the CURVE key it was leased to ("" without keys): only that key's retry gets it again


@dataclass
class DispatcherStats:
    pending: int
    leased: int
    done: int
    hosts_alive: int
    releases: int


@dataclass
class Dispatcher:
    plan: EpochPlan
    host_timeout_s: float = 10.0
    lease_timeout_s: float = 600.0  # a lease older than this is handed out again even if its host lives
    clock: Callable[[], float] = time.monotonic
    on_release: Callable[[str, int], None] | None = None  # (reason, units) for metrics
    done_before: frozenset[int] = frozenset()  # units a previous run completed (resume)
    journal: Journal | None = None  # every lease/ack/release is made durable before it is answered
    _pending: deque[Unit] = field(init=False)  # may hold units acked while queued; lease() skips them
    _pending_ids: set[int] = field(init=False, default_factory=set)
    _leased: dict[int, Lease] = field(init=False, default_factory=dict)
    _done: set[int] = field(init=False, default_factory=set)
    _hosts: dict[str, float] = field(init=False, default_factory=dict)
    _releases: int = field(init=False, default=0)
    _known: set[int] = field(init=False, default_factory=set)
    total_units: int = field(init=False)

    def __post_init__(self) -> None:
        units = [u for epoch in range(self.plan.epochs) for u in self.plan.units(epoch)]
        replayed = self.journal.replayed if self.journal else None
        done = set(self.done_before) | (replayed.done if replayed else set())
        open_leases = replayed.leases if replayed else {}
        self._done = {u.unit_id for u in units if u.unit_id in done}
        now = self.clock()
        for unit in units:  # leases from before a restart stay with their hosts for one host timeout
            if unit.unit_id in open_leases and unit.unit_id not in self._done:
                host, worker, request_id, key = open_leases[unit.unit_id]
                self._leased[unit.unit_id] = Lease(unit, host, worker, now, request_id, key)
                self._hosts.setdefault(host, now)
        self._pending = deque(u for u in units if u.unit_id not in self._done and u.unit_id not in self._leased)
        self._pending_ids = {u.unit_id for u in self._pending}
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
        while self._pending:
            unit = self._pending.popleft()
            self._pending_ids.discard(unit.unit_id)
            if unit.unit_id in self._done:
                continue
            if self.journal:
                self.journal.lease(unit.unit_id, host_id, worker_id, request_id, key)
            self._leased[unit.unit_id] = Lease(unit, host_id, worker_id, self.clock(), request_id, key)
            return unit
        return None

    def ack(self, unit_id: int) -> bool:
        """The consumer has stepped every batch of the unit; True the first time."""
        if unit_id in self._done or unit_id not in self._known:
            return False
        if self.journal:
            self.journal.ack(unit_id)
        self._done.add(unit_id)
        self._leased.pop(unit_id, None)
        self._pending_ids.discard(unit_id)
        return True

    def release(self, host_id: str, worker_ids: Iterable[str] | None, reason: str) -> int:
        """Put a host's (or some of its workers') unacked units back at the front of the queue."""
        wanted = set(worker_ids) if worker_ids else None
        lost = [lease for lease in self._leased.values()
                if lease.host_id == host_id and (wanted is None or lease.worker_id in wanted)]
        if lost and self.journal:
            self.journal.release([lease.unit.unit_id for lease in lost])
        for lease in sorted(lost, key=lambda item: item.leased_at, reverse=True):
            del self._leased[lease.unit.unit_id]
            self._pending.appendleft(lease.unit)
            self._pending_ids.add(lease.unit.unit_id)
        if lost:
            self._releases += len(lost)
            if self.on_release:
                self.on_release(reason, len(lost))
        return len(lost)

    def release_unit(self, unit_id: int, reason: str) -> bool:
        """Hand one leased unit out again (its batches did not add up); True if it was leased."""
        lease = self._leased.get(unit_id)
        if lease is None:
            return False
        if self.journal:
            self.journal.release([unit_id])
        del self._leased[unit_id]
        self._pending.appendleft(lease.unit)
        self._pending_ids.add(unit_id)
        self._releases += 1
        if self.on_release:
            self.on_release(reason, 1)
        return True

    def done_units(self) -> list[int]:
        return sorted(self._done)

    def leases_of(self, host_id: str) -> list[Lease]:
        return [lease for lease in self._leased.values() if lease.host_id == host_id]

    @property
    def finished(self) -> bool:
        return len(self._done) == self.total_units

    def stats(self) -> DispatcherStats:
        return DispatcherStats(len(self._pending_ids), len(self._leased), len(self._done),
                               len(self._hosts), self._releases)
