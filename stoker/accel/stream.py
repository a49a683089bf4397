"""One rank's stream in plan order: batches are released by (epoch, unit position, batch index).

Workers make a rank's units in any order and on any host; this puts their batches back in the
order the plan gives the rank, holding the ones that come early (at most what the senders'
credit allows), so that the same (seed, world size) gives every rank the same sequence of
batches and a data position is just (epoch, step).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from stoker.accel.batch import ReceivedBatch
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.units import Unit


@dataclass
class EpochEnd:
    """Marks the end of a rank's stream for an epoch: `batches` it held in all."""

    epoch: int
    batches: int


@dataclass
class StreamOrder:
    """Puts a rank's batches back in its plan order, holding those that come early (the module says why)."""

    plan: EpochPlan
    rank: int
    epoch: int = 0
    position: int = 0  # unit of the rank's stream that comes next
    index: int = 0  # its batch that comes next
    released: int = 0  # batches of the current epoch released so far (a resume starts past some)
    _held: dict[tuple[int, int], tuple[ReceivedBatch, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._units = self.plan.rank_units(self.epoch, self.rank) if self.epoch < self.plan.epochs else []

    @property
    def done(self) -> bool:
        """Every epoch of the plan has been released."""
        return self.epoch >= self.plan.epochs

    def next_unit(self) -> Unit | None:
        """The unit whose batch the rank waits for."""
        return None if self.done else self._units[self.position]

    def owns(self, unit: Unit) -> bool:
        """The unit is this rank's (a batch of another's is dropped)."""
        return unit.rank == self.rank

    def behind(self, unit: Unit, index: int) -> bool:
        """True for a batch that lies before the stream's current place (already released)."""
        return (unit.epoch, unit.position, index) < (self.epoch, self.position, self.index)

    def offer(self, unit: Unit, index: int, last: bool, item: ReceivedBatch) -> Iterator[ReceivedBatch | EpochEnd]:
        """Hold a batch of `unit`; yield what is now next in order (and epoch ends)."""
        self._held[(unit.unit_id, index)] = (item, last)
        while not self.done:
            key = (self._units[self.position].unit_id, self.index)
            if key not in self._held:
                return
            batch, was_last = self._held.pop(key)
            self.released += 1
            if was_last and self.position + 1 == len(self._units):
                batch.ends_epoch = True
            yield batch
            if not was_last:
                self.index += 1
                continue
            self.position, self.index = self.position + 1, 0
            if self.position == len(self._units):
                yield EpochEnd(self.epoch, self.released)
                self._next_epoch()

    @property
    def held(self) -> int:
        """Batches waiting for their turn."""
        return len(self._held)

    def _next_epoch(self) -> None:
        self.epoch, self.position, self.index, self.released = self.epoch + 1, 0, 0, 0
        self._units = self.plan.rank_units(self.epoch, self.rank) if self.epoch < self.plan.epochs else []
