"""The units leased now: to whom, since when, for which request, and which host a redone unit avoids.

Pure state: the dispatcher (accel.control.dispatcher) decides what to lease and release; this
answers who holds what, finds a repeated request's unit without a scan of every lease, and
remembers, for AVOID_S, the host that ended a unit short so that another host gets it first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from stoker.pipeline.units import Unit

AVOID_S = 5.0  # a unit redone because its leaseholder ended it short goes to another host first, this long


@dataclass
class Lease:
    unit: Unit
    host_id: str
    worker_id: str
    leased_at: float
    request_id: int = 0  # the worker's request that got it: a retry of that request gets this unit again
    key: str = ""  # the CURVE key it was leased to ("" without keys): only that key's retry gets it again

    def held_by(self, host_id: str, worker_id: str, key: str) -> bool:
        return (self.host_id, self.worker_id, self.key) == (host_id, worker_id, key)


@dataclass
class LeaseTable:
    _leased: dict[int, Lease] = field(default_factory=dict)
    _by_request: dict[tuple[str, int, str], int] = field(default_factory=dict)  # (worker, request, key) -> unit
    _avoid: dict[int, tuple[str, float]] = field(default_factory=dict)  # unit -> (host that ended it short,
    # until when another host gets it first)

    def __len__(self) -> int:
        return len(self._leased)

    def __contains__(self, unit_id: int) -> bool:
        return unit_id in self._leased

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leased.values()))

    def get(self, unit_id: int) -> Lease | None:
        return self._leased.get(unit_id)

    def hold(self, lease: Lease) -> None:
        self._leased[lease.unit.unit_id] = lease
        self._avoid.pop(lease.unit.unit_id, None)
        if lease.request_id:
            self._by_request[(lease.worker_id, lease.request_id, lease.key)] = lease.unit.unit_id

    def let_go(self, unit_id: int) -> Lease | None:
        lease = self._leased.pop(unit_id, None)
        if lease is not None and lease.request_id:
            self._by_request.pop((lease.worker_id, lease.request_id, lease.key), None)
        return lease

    def answered(self, worker_id: str, request_id: int, key: str) -> Unit | None:
        """The unit a request was given, if it is still leased: its repeat gets the same unit."""
        unit_id = self._by_request.get((worker_id, request_id, key))
        lease = self._leased.get(unit_id) if unit_id is not None else None
        return lease.unit if lease is not None else None

    def held_per_rank(self, holding: Iterable[int], host_id: str, worker_id: str, key: str,
                      world_size: int) -> dict[int, Unit]:
        """rank -> the unit of it that this process says it holds and does (one per rank: a longer
        list is not believed)."""
        held = {}
        for unit_id in itertools.islice(holding, world_size):
            lease = self._leased.get(unit_id)
            if lease is not None and lease.held_by(host_id, worker_id, key):
                held[lease.unit.rank] = lease.unit
        return held

    def matching(self, host_id: str, worker_ids: Iterable[str] | None, unit_ids: Iterable[int] | None,
                 key: str | None) -> list[Lease]:
        """A host's leases, or some of its workers', or of some units, or only those made to `key`."""
        wanted = set(worker_ids) if worker_ids else None
        units = set(unit_ids) if unit_ids else None
        return [lease for lease in self._leased.values()
                if lease.host_id == host_id and (wanted is None or lease.worker_id in wanted)
                and (units is None or lease.unit.unit_id in units) and (key is None or lease.key == key)]

    def older_than(self, when: float) -> list[Lease]:
        return [lease for lease in self._leased.values() if lease.leased_at < when]

    def of_rank(self, rank: int) -> list[Lease]:
        """The units of `rank` leased now, in its stream's order."""
        return sorted((lease for lease in self._leased.values() if lease.unit.rank == rank),
                      key=lambda lease: (lease.unit.epoch, lease.unit.position))

    # ---- a unit ended short goes to another host first -------------------------------------
    def avoid(self, unit_id: int, host_id: str, until: float) -> None:
        self._avoid[unit_id] = (host_id, until)

    def avoided(self, unit_id: int, host_id: str, now: float, hosts_alive: int) -> bool:
        entry = self._avoid.get(unit_id)
        if entry is None or entry[0] != host_id:
            return False
        if now >= entry[1] or hosts_alive < 2:
            del self._avoid[unit_id]  # no other host took it in time (or there is none): anyone may
            return False
        return True

    def snapshot(self) -> list[list]:
        return [[lease.unit.unit_id, lease.host_id, lease.worker_id, lease.request_id, lease.key]
                for lease in self._leased.values()]
