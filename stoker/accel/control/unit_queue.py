"""The units waiting to be leased, in lease order, made from the plan a few at a time.

A heap ordered position by position across the data-parallel ranks (`EpochPlan.lease_order`),
holding the epoch being leased and a part of the next: each lease makes a few units of the next
epoch (MAKE_AHEAD_UNITS), so that it is ready when leasing reaches it and no lease waits for a
whole epoch to be made. A unit released (its host died, it was handed back) goes back at its
place, so the earliest unit is always the next one handed out. Pure state: what is done or
leased elsewhere is asked through the callables it is given.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.units import Unit

SCAN_PAST = 64  # pending units a lease may pass over (ranks the asking process holds) before it says wait
MAKE_AHEAD_UNITS = 16  # units of the next epoch made per lease: ~0.1 ms, the epoch ready well before it is due

_Entry = tuple[int, int, int, int, Unit]  # (epoch, position, rank, id, unit)


def lease_key(unit: Unit) -> tuple[int, int, int]:
    """The order units are leased in: position by position across the ranks (EpochPlan.lease_order)."""
    return unit.epoch, unit.position, unit.rank


@dataclass
class UnitQueue:
    plan: EpochPlan
    is_done: Callable[[int], bool]
    is_out: Callable[[int], bool]  # leased now, or all its batches at their rank
    loaded: int = 0  # epochs whose units have been put in the heap
    _pending: list[_Entry] = field(default_factory=list)  # may hold done units and, after a reload, one twice
    _pending_ids: set[int] = field(default_factory=set)
    _making: Iterator[Unit] | None = None  # epoch `loaded`'s units, part-way in

    def __len__(self) -> int:
        """Units waiting in the heap (the loaded epochs' and the part made ahead)."""
        return len(self._pending_ids)

    def requeue(self, unit: Unit) -> None:
        heapq.heappush(self._pending, (*lease_key(unit), unit.unit_id, unit))
        self._pending_ids.add(unit.unit_id)

    def forget(self, unit_id: int) -> None:
        """The unit is done: it is never handed out again (its heap entry is dropped when reached)."""
        self._pending_ids.discard(unit_id)

    def fill(self) -> bool:
        """Load epochs, in order, until the heap holds a unit of a loaded epoch (a released unit, or
        a unit of the epoch being made ahead, waits for its epoch's turn); False when no unit is
        left. An epoch whose units are all done, leased or received adds nothing, so the next is
        loaded."""
        while self.loaded < self.plan.epochs and (not self._pending or self._pending[0][0] >= self.loaded):
            self._load(None)
        return bool(self._pending)

    def reload_from(self, epoch: int) -> None:
        """Make the epochs again from `epoch` on: a unit neither done, out nor pending goes back in
        the heap; the rest are skipped."""
        self.loaded, self._making = epoch, None
        self.fill()

    def make_ahead(self) -> None:
        """A few units of the epoch after the one being leased."""
        if self.loaded < self.plan.epochs and self._pending and self.loaded <= self._pending[0][0] + 1:
            self._load(MAKE_AHEAD_UNITS)

    def _load(self, most: int | None) -> None:
        """Put up to `most` more units (all, for None) of epoch `loaded` in the heap; once its last
        is in, the epoch is loaded."""
        if self._making is None:
            self._making = self.plan.units_stepwise(self.loaded)
        taken = 0
        for unit in itertools.islice(self._making, most):
            taken += 1
            if not (self.is_done(unit.unit_id) or self.is_out(unit.unit_id) or unit.unit_id in self._pending_ids):
                self.requeue(unit)
        if most is None or taken < most:
            self._making, self.loaded = None, self.loaded + 1

    def take(self, wanted: Callable[[Unit], bool]) -> Unit | None:
        """Pop the earliest pending unit that `wanted` accepts; the units passed over keep their
        places. The scan stops after a bounded number of them: each rank's first pending unit lies
        within a few positions of the front (units are leased position by position), so a longer
        scan would only find units of ranks far ahead of the others."""
        passed: list[_Entry] = []
        limit = SCAN_PAST + 2 * self.plan.world_size
        try:
            while self.fill() and len(passed) <= limit:
                entry = heapq.heappop(self._pending)
                unit = entry[-1]
                if self.is_done(unit.unit_id):
                    self._pending_ids.discard(unit.unit_id)
                    continue
                if not wanted(unit):
                    passed.append(entry)
                    continue
                self._pending_ids.discard(unit.unit_id)
                return unit
            return None
        finally:
            for entry in passed:
                heapq.heappush(self._pending, entry)

    def open_of_rank(self, rank: int) -> tuple[int, Unit | None]:
        """How many of `rank`'s units in the loaded epochs are pending, and its earliest one."""
        pending = {item[3]: item for item in self._pending if item[4].rank == rank and item[3] in self._pending_ids
                   and not self.is_out(item[3]) and not self.is_done(item[3])}  # the heap may hold one twice
        first = min(pending.values(), key=lambda item: item[:4], default=None)
        return len(pending), first[4] if first else None
