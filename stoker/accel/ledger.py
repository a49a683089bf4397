"""Exactly-once accounting on the consumer: which batches and samples each epoch delivered.

A redone unit yields byte-identical batches, so a batch is a duplicate exactly when its
(unit, batch index) was admitted before, or its unit was already completed. A batch's
sample ids must belong to its unit as the plan gives it, and a unit is complete only when
its batches have accounted for every one of its samples (delivered or skipped): a "last"
batch that leaves samples out (only a misbehaving leaseholder sends one, an empty one for
instance) is not admitted (ShortUnit), and the consumer has the unit leased again, elsewhere
first. Should a unit's stepped batches still end short, it is closed with its missing samples
reported as skipped, never silently counted as delivered.

The books keep what the open epochs need: a bitmap of delivered samples and the set of completed
units for each epoch still under way, folded into one count when the rank's last unit of the
epoch completes (any batch of a closed epoch is a duplicate), so memory does not grow with the
epoch number.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

import numpy as np

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.units import Unit
from stoker.protos.errors import PeerError

log = logging.getLogger("stoker.consumer")


@dataclass
class Skipped:
    """A sample the job will not deliver this epoch, and why (the report names it by `key`)."""

    epoch: int
    sample_id: int
    key: str
    reason: str


class Step(enum.Enum):
    """What a finished step did to its unit."""

    OPEN = "open"  # more batches to come
    DONE = "done"  # every batch stepped, every sample accounted for: ack the unit
    INCOMPLETE = "incomplete"  # every batch stepped but samples are missing: reported as skipped; ack it


@dataclass
class _UnitProgress:
    size: int  # samples the plan gives the unit
    admitted: set[int] = field(default_factory=set)
    stepped: set[int] = field(default_factory=set)  # batch indexes a training step has used
    expected: int | None = None  # known once the unit's last batch arrives
    admitted_last: int | None = None  # batches the unit has, known when its last batch is admitted
    covered: set[int] = field(default_factory=set)  # sample ids stepped or skipped
    seen: set[int] = field(default_factory=set)  # sample ids the admitted batches hold, delivered or skipped


@dataclass
class _OpenEpoch:
    """An epoch still under way on this rank: what its units and samples have done so far."""

    completed: set[int] = field(default_factory=set)  # unit ids
    own: int = 0  # of them, this rank's: the epoch closes when they are all its units
    delivered: np.ndarray | None = None  # bitmap of stepped sample ids, made at the first step


class InvalidBatch(PeerError, ValueError):
    """A batch whose accounting fields make no sense (ids outside its unit, bad epoch)."""

    reason = "bad_accounting"


class ShortUnit(InvalidBatch):
    """A unit's last batch that leaves samples of the unit out (only a misbehaving leaseholder sends
    one): it is not admitted, and the unit is leased again, so nothing is lost."""

    reason = "short_unit"


class Ledger:
    """One rank's books: which batches of which units arrived and were stepped, so a batch made
    twice (a lost host's unit leased again) is stepped once and every sample is accounted for."""

    def __init__(self, plan: EpochPlan, rank: int = 0) -> None:
        self.plan = plan
        self.num_samples = plan.sample_id_space  # a mixture's repeated document has an id per pass
        self.epochs = plan.epochs
        self.rank = rank
        self._units_here: dict[int, int] = {}  # epoch -> this rank's units in it (a resumed epoch has its own)
        self._open: dict[int, _OpenEpoch] = {}
        self._closed: dict[int, int] = {}  # epoch whose units have all completed -> its unique samples
        self._units: dict[int, _UnitProgress] = {}
        self.skipped: dict[tuple[int, int], Skipped] = {}
        self.samples = 0
        self.duplicate_samples = 0
        self.duplicate_batches = 0
        self.incomplete_units = 0
        self.collisions = 0  # a sample delivered twice in one epoch by distinct batches: a bug

    def _check(self, epoch: int, unit_id: int, ids: np.ndarray) -> Unit:
        """The planned unit a batch of these sample ids says it is from; InvalidBatch when it is not."""
        unit = self.plan.unit(unit_id)
        if unit is None:
            raise InvalidBatch(f"unit {unit_id} is not in the job's plan")
        if epoch != unit.epoch:
            raise InvalidBatch(f"unit {unit_id} belongs to epoch {unit.epoch}, not {epoch}")
        if ids.size and not np.isin(ids, unit.sample_ids()).all():
            raise InvalidBatch(f"sample ids outside unit {unit_id}")
        return unit

    def admit(self, epoch: int, unit_id: int, batch_index: int, sample_ids: np.ndarray,
              skipped_ids: np.ndarray | None = None, last: bool = False, stepped_before: np.ndarray | None = None
              ) -> bool:
        """True if the batch is new; False (and counted) if it is a duplicate. `stepped_before`: a text unit
        part-stepped at another world size names the documents its batches stepped then held: accounted
        for, not delivered here."""
        skipped_ids = np.empty(0, dtype=np.int64) if skipped_ids is None else skipped_ids
        before = np.empty(0, dtype=np.int64) if stepped_before is None else stepped_before
        unit = self._check(epoch, unit_id, np.concatenate([sample_ids, skipped_ids, before]))
        progress = self._units.get(unit_id)
        if self._completed(epoch, unit_id) or (progress and batch_index in progress.admitted):
            self.duplicate_batches += 1
            self.duplicate_samples += int(sample_ids.size)
            return False
        if progress is None:
            progress = self._units[unit_id] = _UnitProgress(unit.size)
        progress.covered.update(before.tolist())
        here = set(sample_ids.tolist()) | set(skipped_ids.tolist()) | set(before.tolist())
        if last and len(progress.seen | here) < progress.size:
            if not progress.admitted:
                del self._units[unit_id]
            raise ShortUnit(f"unit {unit_id}'s last batch (index {batch_index}) leaves "
                            f"{progress.size - len(progress.seen | here)} of its {progress.size} samples out")
        progress.seen |= here
        progress.admitted.add(batch_index)
        if last:
            progress.admitted_last = batch_index + 1
        return True

    def received(self, unit_id: int) -> bool:
        """Every batch of the unit is here (not necessarily stepped)."""
        progress = self._units.get(unit_id)
        return progress is not None and progress.admitted_last == len(progress.admitted)

    def record_skips(self, epoch: int, skipped: list[Skipped]) -> None:
        """Remember the samples a stepped batch left out, for the report."""
        for item in skipped:
            self.skipped[(epoch, item.sample_id)] = item

    def stepped(self, epoch: int, unit_id: int, batch_index: int, last: bool, sample_ids: np.ndarray,
                skipped_ids: np.ndarray, replayed: bool = False) -> Step:
        """Record a finished step: `sample_ids` trained on, `skipped_ids` accounted for without.
        `replayed`: stepped before a resume, so accounted for here but not delivered again."""
        if not replayed:
            books = self._open.setdefault(epoch, _OpenEpoch())
            if books.delivered is None:
                books.delivered = np.zeros(self.num_samples, dtype=bool)
            delivered = books.delivered
            self.collisions += int(np.count_nonzero(delivered[sample_ids]))
            delivered[sample_ids] = True
            self.samples += int(sample_ids.size)
        progress = self._units[unit_id]
        progress.stepped.add(batch_index)
        progress.covered.update(sample_ids.tolist(), skipped_ids.tolist())
        if last:
            progress.expected = batch_index + 1
        return self._settle(epoch, unit_id, progress)

    def _completed(self, epoch: int, unit_id: int) -> bool:
        return epoch in self._closed or (epoch in self._open and unit_id in self._open[epoch].completed)

    def _complete(self, epoch: int, unit_id: int) -> None:
        """The unit is done; the epoch's books fold into a count once every unit of this rank is."""
        books = self._open.setdefault(epoch, _OpenEpoch())
        books.completed.add(unit_id)
        unit = self.plan.unit(unit_id)
        books.own += unit is not None and unit.rank == self.rank
        if books.own >= self._units_of(epoch):
            del self._open[epoch]
            self._closed[epoch] = 0 if books.delivered is None else int(np.count_nonzero(books.delivered))

    def _units_of(self, epoch: int) -> int:
        if epoch not in self._units_here:
            self._units_here = {epoch: len(self.plan.rank_units(epoch, self.rank))}  # the open epoch's; made once
        return self._units_here[epoch]

    def _settle(self, epoch: int, unit_id: int, progress: _UnitProgress) -> Step:
        if progress.expected is None or len(progress.stepped) < progress.expected:
            return Step.OPEN
        del self._units[unit_id]
        self._complete(epoch, unit_id)
        if len(progress.covered) == progress.size:
            return Step.DONE
        # Only a misbehaving leaseholder gets here: what it left out is reported, not delivered.
        self.incomplete_units += 1
        unit = self.plan.unit(unit_id)
        assert unit is not None, "a unit with progress was admitted, so it is in the plan"
        missing = sorted(set(unit.sample_ids().tolist()) - progress.covered)
        log.error("unit %d closed with %d of its %d samples missing; they are reported as skipped",
                  unit_id, len(missing), progress.size)
        for sample_id in missing:
            self.skipped[(unit.epoch, sample_id)] = Skipped(unit.epoch, sample_id, f"sample {sample_id}",
                                                            "lost: its unit's batches did not hold it")
        return Step.INCOMPLETE

    def restore(self, completed: set[int]) -> None:
        """Resume: units completed before arrive again as duplicates."""
        for unit_id in sorted(completed):
            unit = self.plan.unit(unit_id)
            if unit is not None and not self._completed(unit.epoch, unit_id):
                self._complete(unit.epoch, unit_id)

    @property
    def open_units(self) -> int:
        """Units with batches admitted and not all stepped."""
        return len(self._units)

    @property
    def open_epochs(self) -> int:
        """Epochs whose books are still kept in full (the rest are one count each)."""
        return len(self._open)

    @property
    def epochs_with_books(self) -> int:
        """Epochs up to the last one with books here (0: none)."""
        return 1 + max((*self._closed, *self._open), default=-1)

    @property
    def unique_samples(self) -> int:
        """Distinct samples delivered, summed over the epochs."""
        return sum(self.unique_in_epoch(epoch) for epoch in {*self._closed, *self._open})

    def unique_in_epoch(self, epoch: int) -> int:
        """Distinct samples of `epoch` delivered so far."""
        if epoch in self._closed:
            return self._closed[epoch]
        books = self._open.get(epoch)
        return 0 if books is None or books.delivered is None else int(np.count_nonzero(books.delivered))
