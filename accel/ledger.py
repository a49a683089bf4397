"""Exactly-once accounting on the consumer: which batches and samples each epoch delivered.

A redone unit yields byte-identical batches, so a batch is a duplicate exactly when its
(unit, batch index) was admitted before, or its unit was already completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Skipped:
    epoch: int
    sample_id: int
    key: str
    reason: str


@dataclass
class _UnitProgress:
    admitted: set[int] = field(default_factory=set)
    stepped: set[int] = field(default_factory=set)  # batch indexes a training step has used
    expected: int | None = None  # known once the unit's last batch arrives


class InvalidBatch(ValueError):
    """A batch whose accounting fields make no sense (ids out of range, bad epoch)."""


class Ledger:
    def __init__(self, num_samples: int, epochs: int) -> None:
        self.num_samples = num_samples
        self.epochs = epochs
        self._delivered: dict[int, np.ndarray] = {}
        self._units: dict[int, _UnitProgress] = {}
        self._completed: set[int] = set()
        self.skipped: dict[tuple[int, int], Skipped] = {}
        self.samples = 0
        self.duplicate_samples = 0
        self.duplicate_batches = 0
        self.collisions = 0  # a sample delivered twice in one epoch by distinct batches: a bug

    def admit(self, epoch: int, unit_id: int, batch_index: int, sample_ids: np.ndarray) -> bool:
        """True if the batch is new; False (and counted) if it is a duplicate."""
        if not 0 <= epoch < self.epochs:
            raise InvalidBatch(f"epoch {epoch} outside 0..{self.epochs - 1}")
        if sample_ids.size and (sample_ids.min() < 0 or sample_ids.max() >= self.num_samples):
            raise InvalidBatch(f"sample ids outside 0..{self.num_samples - 1}")
        progress = self._units.get(unit_id)
        if unit_id in self._completed or (progress and batch_index in progress.admitted):
            self.duplicate_batches += 1
            self.duplicate_samples += int(sample_ids.size)
            return False
        self._units.setdefault(unit_id, _UnitProgress()).admitted.add(batch_index)
        return True

    def record_skips(self, epoch: int, skipped: list[Skipped]) -> None:
        for item in skipped:
            self.skipped[(epoch, item.sample_id)] = item

    def stepped(self, epoch: int, unit_id: int, batch_index: int, last: bool,
                sample_ids: np.ndarray) -> bool:
        """Record a finished step; True when it completes its unit (time to ack)."""
        delivered = self._delivered.setdefault(epoch, np.zeros(self.num_samples, dtype=bool))
        already = int(np.count_nonzero(delivered[sample_ids]))
        self.collisions += already
        delivered[sample_ids] = True
        self.samples += int(sample_ids.size)
        progress = self._units[unit_id]
        progress.stepped.add(batch_index)
        if last:
            progress.expected = batch_index + 1
        if progress.expected is not None and len(progress.stepped) == progress.expected:
            del self._units[unit_id]
            self._completed.add(unit_id)
            return True
        return False

    # ---- checkpoints ---------------------------------------------------------------------
    def position(self) -> dict[str, dict]:
        """Units in progress: which of their batches a step has used, and how many they have."""
        return {str(unit): {"stepped": sorted(p.stepped), "batches": p.expected}
                for unit, p in self._units.items() if p.stepped}

    def restore(self, completed: set[int], position: dict[str, dict]) -> None:
        """Resume: completed units and already-stepped batches arrive again as duplicates."""
        self._completed |= completed
        for unit, entry in position.items():
            stepped = set(entry["stepped"])
            self._units[int(unit)] = _UnitProgress(admitted=set(stepped), stepped=stepped, expected=entry["batches"])

    @property
    def unique_samples(self) -> int:
        return int(sum(np.count_nonzero(d) for d in self._delivered.values()))

    def delivered(self, epoch: int) -> np.ndarray:
        """A copy of the epoch's bitmap of stepped samples."""
        found = self._delivered.get(epoch)
        return np.zeros(self.num_samples, dtype=bool) if found is None else found.copy()

    def unique_in_epoch(self, epoch: int) -> int:
        delivered = self._delivered.get(epoch)
        return 0 if delivered is None else int(np.count_nonzero(delivered))
