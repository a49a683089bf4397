"""Work units: runs of a shard's rows, the units an epoch plan cuts them into, and how a unit's rows are
cut into batches. Plain data, below the plan (pipeline.plan) and what a resume leaves of an epoch
(pipeline.remainder), which both build on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.pipeline.seeds import derived_rng


@dataclass(frozen=True)
class Segment:
    """Rows [start, stop) of one shard."""

    shard_index: int
    start: int
    stop: int
    first_sample_id: int  # global id of the shard's row 0

    @property
    def size(self) -> int:
        """Rows in the run."""
        return self.stop - self.start


@dataclass(frozen=True)
class Unit:
    """A run of one rank's stream: whole batches of rows, delivered in one epoch."""

    unit_id: int  # unique in the job: epoch * units_per_epoch + index in the epoch (rank-major)
    epoch: int
    segments: tuple[Segment, ...]
    rank: int = 0
    position: int = 0  # its place in the rank's stream this epoch: batches are delivered in this order
    skip: int = 0  # text: its first batches, stepped by a job of another world size: made again, not sent

    @property
    def size(self) -> int:
        """Samples in the unit."""
        return sum(s.size for s in self.segments)

    def sample_ids(self) -> np.ndarray:
        """Global ids of the unit's samples, in plan (not visiting) order."""
        parts = [np.arange(s.first_sample_id + s.start, s.first_sample_id + s.stop, dtype=np.int64)
                 for s in self.segments]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def rows(self, seed: int) -> list[tuple[int, int, int]]:
        """(shard index, row in shard, global sample id) of every sample, in this epoch's seeded order."""
        return [(shard, row, sample) for shard, row, sample in self.visits(seed).tolist()]

    def visits(self, seed: int) -> np.ndarray:
        """`rows` as an (n, 3) int64 array, made by whole-array steps: a unit of a token set holds thousands."""
        rows = [np.arange(s.start, s.stop, dtype=np.int64) for s in self.segments]
        flat = np.empty((self.size, 3), dtype=np.int64)
        if rows:
            flat[:, 0] = np.repeat([s.shard_index for s in self.segments], [s.size for s in self.segments])
            flat[:, 1] = np.concatenate(rows)
            flat[:, 2] = flat[:, 1] + np.repeat([s.first_sample_id for s in self.segments],
                                                [s.size for s in self.segments])
        first = self.segments[0] if self.segments else Segment(0, 0, 0, 0)
        rng = derived_rng(seed, self.epoch, f"unit-{first.shard_index}-{first.start}-{self.size}")
        return flat[rng.permutation(len(flat))]


def batch_bounds(rows: int, batch_size: int) -> list[tuple[int, int]]:
    """Where a unit's rows are cut into batches: ceil(rows / batch_size) batches, all full but the
    last two when the remainder is under half a batch (they share it, so no batch is a sliver:
    a one-row batch would break batch norm in training). At least one (possibly empty) batch."""
    count = max(1, -(-rows // batch_size))
    bounds = [(i * batch_size, min((i + 1) * batch_size, rows)) for i in range(count)]
    remainder = rows - (count - 1) * batch_size
    if count >= 2 and 0 < remainder < batch_size / 2:
        start = (count - 2) * batch_size
        middle = start + (batch_size + remainder + 1) // 2
        bounds[-2:] = [(start, middle), (middle, rows)]
    return bounds


def split_rows(total: int, world_size: int, whole_batches: int = 0) -> tuple[int, ...]:
    """`total` rows as rank stream sizes: they differ by at most one (`whole_batches`: drop_last's batch, and
    every stream the same whole number of them)."""
    if whole_batches:
        return (total // world_size // whole_batches * whole_batches,) * world_size
    base, extra = divmod(total, world_size)
    return tuple(base + (rank < extra) for rank in range(world_size))
