"""The epoch plan: work units (ranges of one shard) in a seeded order per epoch."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.seeds import derived_rng
from pipeline.shards import Manifest

_UNIT_ORDER_KEY = "unit-order"


@dataclass(frozen=True)
class Unit:
    """A contiguous range of one shard's rows, to be delivered in one epoch."""

    unit_id: int  # unique in the job: epoch * units_per_epoch + position in the base list
    epoch: int
    shard_index: int
    start: int
    stop: int
    first_sample_id: int  # global id of the shard's row 0

    @property
    def size(self) -> int:
        return self.stop - self.start

    def sample_order(self, seed: int) -> np.ndarray:
        """Shard rows of this unit in this epoch's seeded order."""
        rng = derived_rng(seed, self.epoch, f"unit-{self.shard_index}-{self.start}")
        return self.start + rng.permutation(self.size)


@dataclass(frozen=True)
class EpochPlan:
    manifest: Manifest
    unit_size: int
    epochs: int
    seed: int

    def base_ranges(self) -> list[tuple[int, int, int, int]]:
        """(shard, start, stop, first_sample_id) for every unit of one epoch, unshuffled."""
        return list(self._ranges)

    @cached_property
    def _ranges(self) -> tuple[tuple[int, int, int, int], ...]:
        ranges = []
        for index, shard in enumerate(self.manifest.shards):
            for start in range(0, shard.num_samples, self.unit_size):
                ranges.append((index, start, min(start + self.unit_size, shard.num_samples),
                               shard.first_sample_id))
        return tuple(ranges)

    def unit(self, unit_id: int) -> Unit | None:
        """The unit with this id (any epoch), or None when the plan has no such unit."""
        ranges = self._ranges
        epoch, index = divmod(unit_id, len(ranges)) if ranges else (self.epochs, 0)
        if not 0 <= epoch < self.epochs:
            return None
        return Unit(unit_id, epoch, *ranges[index])

    def units(self, epoch: int) -> list[Unit]:
        """This epoch's units in the order they are leased."""
        ranges = self.base_ranges()
        order = derived_rng(self.seed, epoch, _UNIT_ORDER_KEY).permutation(len(ranges))
        return [Unit(epoch * len(ranges) + int(i), epoch, *ranges[int(i)]) for i in order]
