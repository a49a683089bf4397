"""The epoch plan: one stream of work units per data-parallel rank, from (seed, epoch, world size).

Each epoch, the shards' rows are cut into blocks of `unit_size` rows (a block never crosses
a shard), the blocks are put in a seeded order, and the resulting sequence of every row is
cut into `world_size` contiguous streams whose lengths differ by at most one row: every
sample is in exactly one rank's stream. Each stream is cut into units of `unit_size` rows,
so a unit may join the tail of one block to the head of the next (its `segments`), and
only a rank's last unit is short: with unit_size a multiple of the batch size, every batch
but each rank's last of the epoch is full. With `drop_last`, every stream is cut down to the
same whole number of batches and the epoch's last rows (a different few each epoch, as the
blocks are reshuffled) are left out of the plan. A unit's rows are visited in a seeded order of
their own. The plan is a pure function of (manifest, unit size, epochs, seed, world size,
resumed), so every process that holds it (dispatcher, each rank, the workers) agrees on it.

A job resumed at another world size (`Resumed`) continues the epoch it was checkpointed in: the
rows its ranks had not stepped yet (the units after each rank's position, and what was left of
the unit it was part-way through, as the rows it had not visited) are cut into the new world
size's streams the same way, and later epochs are planned for the new world size. A chain of
such cuts (resumed at 8 ranks, then at 6, then at 7 in one epoch) is applied in order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from stoker.pipeline.seeds import derived_rng
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.mixture import MIXTURE, Schedule
from stoker.protos.errors import ConfigError, DataError

_UNIT_ORDER_KEY = "unit-order"
_CACHE_LOCK = threading.Lock()  # every plan's epoch cache: trims are rare and quick, one lock serves all


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


@dataclass(frozen=True)
class Cut:
    """Where a job of `world_size` ranks stood in an epoch when it was checkpointed: after `step` steps,
    rank r had wholly consumed `ranks[r][0]` of its units and `ranks[r][1]` batches of the next."""

    world_size: int
    step: int
    ranks: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Resumed:
    """The epoch a job resumed at another world size continues, and the cuts that led there (oldest first)."""

    epoch: int
    cuts: tuple[Cut, ...]

    def to_json(self) -> str:
        """The text a job carries it as (JobConfig.resumed)."""
        return json.dumps({"epoch": self.epoch, "cuts": [[c.world_size, c.step, [list(r) for r in c.ranks]]
                                                         for c in self.cuts]})

    @classmethod
    def from_json(cls, text: str) -> Resumed | None:
        """Read what `to_json` wrote; None for the empty text of a job that is not resumed."""
        if not text:
            return None
        data = json.loads(text)
        return cls(int(data["epoch"]), tuple(Cut(int(w), int(s), tuple((int(u), int(b)) for u, b in r))
                                             for w, s, r in data["cuts"]))


@dataclass(frozen=True)
class EpochPlan:
    """Every epoch's units, from (manifest, seed, world size, sizes) alone, so that every process
    that holds the job computes the same plan and a position in it is just (epoch, step)."""

    manifest: Manifest
    unit_size: int
    epochs: int
    seed: int
    world_size: int = 1
    batch_size: int = 0  # 0: the unit size; a rank's last unit takes in a remainder under half a batch
    drop_last: bool = False  # every rank streams the same whole batches; the rows past them sit the epoch out
    resumed: Resumed | None = None  # the epoch a job of another world size left part-way, and where

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world size must be at least 1, not {self.world_size}")
        if self.unit_size < 1:
            raise ConfigError(f"unit size must be at least 1, not {self.unit_size}")
        if self.manifest.num_samples < self.world_size:
            raise ConfigError(f"{self.manifest.num_samples} samples cannot feed {self.world_size} ranks: every rank "
                             f"needs at least one")
        if self._mixture is not None and min(self.rank_sizes) == 0:
            raise ConfigError(f"epoch 0 of the mixture holds {sum(self.rank_sizes)} documents, fewer than the "
                              f"{self.world_size} ranks: give it a larger budget")
        if self.drop_last and self.rank_sizes[0] == 0:
            raise ConfigError(f"with drop_last, {self.manifest.num_samples} samples do not make one batch of "
                             f"{self.batch_size or self.unit_size} for each of {self.world_size} ranks")
        if self.resumed is not None:
            _check_resumed(self, self.resumed)

    @cached_property
    def _blocks(self) -> tuple[Segment, ...]:
        blocks = []
        for index, shard in enumerate(self.manifest.shards):
            for start in range(0, shard.num_samples, self.unit_size):
                blocks.append(Segment(index, start, min(start + self.unit_size, shard.num_samples),
                                      shard.first_sample_id))
        return tuple(blocks)

    @cached_property
    def _mixture(self) -> Schedule | None:
        """A mixture of token sources (pipeline.text.mixture) picks each epoch's documents; None: every sample."""
        return Schedule.of(self.manifest, self.unit_size) if MIXTURE in self.manifest.tokens else None

    @cached_property
    def sample_id_space(self) -> int:
        """Sample ids run below this: the samples, or a mixture's documents times the passes an epoch may hold."""
        return self.manifest.num_samples if self._mixture is None else self._mixture.id_space

    @cached_property
    def rank_sizes(self) -> tuple[int, ...]:
        """Samples in each rank's stream, every epoch: they differ by at most one (none with drop_last).
        A mixture's epochs differ in size: these are its epoch 0's (`epoch_rank_sizes` has each)."""
        return self.epoch_rank_sizes(0)

    def epoch_rank_sizes(self, epoch: int) -> tuple[int, ...]:
        """Samples in each rank's stream in a whole `epoch` (not one a resumed job continues)."""
        rows = self.manifest.num_samples if self._mixture is None else self._mixture.rows(self.seed, epoch)
        return _split(self, rows, self.world_size)

    @cached_property
    def _mixture_units(self) -> tuple[tuple[int, ...], ...]:
        """A mixture's units per rank, epoch by epoch (counted from each epoch's sizes, no unit made)."""
        return tuple(tuple(len(_unit_sizes(self, size)) for size in self.epoch_rank_sizes(epoch))
                     for epoch in range(self.epochs))

    def step_offset(self, epoch: int) -> int:
        """Steps of `epoch` taken before its first unit: those a resumed job's earlier world size took."""
        return self.resumed.cuts[-1].step if self.resumed is not None and epoch == self.resumed.epoch else 0

    @cached_property
    def units_per_rank(self) -> tuple[int, ...]:
        """Units in each rank's stream in a whole epoch."""
        return tuple(len(_unit_sizes(self, size)) for size in self.rank_sizes)

    @cached_property
    def samples_per_epoch(self) -> int:
        """The samples every epoch delivers: the dataset, less what drop_last leaves out."""
        return sum(self.rank_sizes)

    @cached_property
    def units_per_epoch(self) -> int:
        """Units of a whole epoch, every rank's; unit ids of epoch e start at e times this (a mixture: the
        most any epoch has)."""
        if self._mixture is not None:
            return max(sum(counts) for counts in self._mixture_units)
        return sum(self.units_per_rank)

    def units_in(self, epoch: int) -> int:
        """How many units `epoch` has: units_per_epoch, or fewer in the epoch a resumed job continues
        (unit ids of epoch e start at e * units_per_epoch whatever their number)."""
        if self.resumed is not None and epoch == self.resumed.epoch:
            return len(self._units(epoch))
        if self._mixture is None:
            return self.units_per_epoch
        return sum(self._mixture_units[epoch]) if epoch < self.epochs else 0  # past the last epoch: none

    @cached_property
    def total_units(self) -> int:
        """Units of the whole job: counted, not summed epoch by epoch (a job of 2**31 - 1 epochs, the
        most --epochs takes, spent some 5 minutes here before its first lease)."""
        if self._mixture is not None:
            return sum(self.units_in(epoch) for epoch in range(self.epochs))
        return self.units_per_epoch * self.epochs + _resumed_change(self, self.units_per_epoch, self.units)

    def rank_total_units(self, rank: int) -> int:
        """Units of `rank`'s streams over the whole job (what a rank attached to the dispatcher awaits)."""
        if self._mixture is not None:
            return sum(len(self.rank_units(e, rank)) if self.resumed is not None and e == self.resumed.epoch
                       else self._mixture_units[e][rank] for e in range(self.epochs))
        per_epoch = self.units_per_rank[rank]
        return per_epoch * self.epochs + _resumed_change(self, per_epoch, lambda epoch: self.rank_units(epoch, rank))

    def units(self, epoch: int) -> list[Unit]:
        """This epoch's units, rank by rank, each rank's in stream order."""
        return list(self._units(epoch))

    def rank_units(self, epoch: int, rank: int) -> list[Unit]:
        """One rank's units of an epoch, in stream order."""
        return [unit for unit in self._units(epoch) if unit.rank == rank]

    def lease_order(self, epoch: int) -> list[Unit]:
        """The order the dispatcher hands units out: position by position across the ranks, so
        that no rank's stream runs ahead of the others'."""
        return sorted(self._units(epoch), key=lambda u: (u.position, u.rank))

    def unit(self, unit_id: int) -> Unit | None:
        """The unit with this id (any epoch), or None when the plan has no such unit."""
        if not self.units_per_epoch:
            return None
        epoch, index = divmod(unit_id, self.units_per_epoch)
        if not 0 <= epoch < self.epochs or index >= self.units_in(epoch):
            return None
        return self._units(epoch)[index]

    @cached_property
    def _cache(self) -> _UnitCache:
        return _UnitCache()

    def _units(self, epoch: int) -> tuple[Unit, ...]:
        """Made once per epoch and kept (the last few epochs: a job walks them in order)."""
        found = self._cache.get(epoch)
        return self._cache.keep(epoch, tuple(self._make_units(epoch))) if found is None else found

    def units_stepwise(self, epoch: int) -> Iterator[Unit]:
        """The epoch's units, rank by rank, made as they are asked for: the dispatcher spreads the
        making of the next epoch (tens of ms at ImageNet-1k size) over many leases instead of
        stalling one. Kept, as `units` keeps them, once the last is made."""
        found = self._cache.get(epoch)
        if found is not None:
            yield from found
            return
        made = []
        for unit in self._make_units(epoch):
            made.append(unit)
            yield unit
        self._cache.keep(epoch, tuple(made))

    def _make_units(self, epoch: int) -> Iterator[Unit]:
        if self.resumed is not None and epoch == self.resumed.epoch:
            stream, sizes = _remainder(self, epoch, self.resumed.cuts)
        else:
            blocks = self._blocks if self._mixture is None else \
                tuple(Segment(*run) for run in self._mixture.runs(self.seed, epoch))
            order = derived_rng(self.seed, epoch, _UNIT_ORDER_KEY).permutation(len(blocks))
            stream, sizes = [blocks[int(i)] for i in order], self.epoch_rank_sizes(epoch)
        yield from self._cut(epoch, stream, sizes)

    def _cut(self, epoch: int, stream: list[Segment], sizes: tuple[int, ...]) -> Iterator[Unit]:
        """`stream` (runs of rows, in order) cut into consecutive rank streams of `sizes` rows, each cut
        into units."""
        made = 0
        cursor = 0  # index into stream
        offset = 0  # rows of stream[cursor] already taken
        for rank, size in enumerate(sizes):
            for position, want in enumerate(_unit_sizes(self, size)):
                segments = []
                while want > 0:
                    block = stream[cursor]
                    take = min(want, block.size - offset)
                    segments.append(Segment(block.shard_index, block.start + offset, block.start + offset + take,
                                            block.first_sample_id))
                    want -= take
                    offset += take
                    if offset == block.size:
                        cursor, offset = cursor + 1, 0
                yield Unit(epoch * self.units_per_epoch + made, epoch, tuple(segments), rank, position)
                made += 1


# ---- the plan's sizes, and a plan resumed at another world size --------------------------------------
class _UnitCache:
    """A plan's units of the last few epochs (a job walks them in order). Locked: a consumer's receive loop
    and its training thread both ask a plan for units, and trimming iterates the cache while the other
    thread may insert."""

    def __init__(self) -> None:
        self._epochs: dict[int, tuple[Unit, ...]] = {}

    def __len__(self) -> int:  # epochs held
        return len(self._epochs)

    def get(self, epoch: int) -> tuple[Unit, ...] | None:
        return self._epochs.get(epoch)

    def keep(self, epoch: int, units: tuple[Unit, ...]) -> tuple[Unit, ...]:
        with _CACHE_LOCK:
            self._epochs[epoch] = units
            while len(self._epochs) > 4:
                del self._epochs[min(self._epochs)]
        return units


def _split(plan: EpochPlan, total: int, world_size: int) -> tuple[int, ...]:
    """`total` rows as rank stream sizes: they differ by at most one (with drop_last, whole batches each)."""
    if plan.drop_last:
        batch = plan.batch_size or plan.unit_size
        return (total // world_size // batch * batch,) * world_size
    base, extra = divmod(total, world_size)
    return tuple(base + (rank < extra) for rank in range(world_size))


def _unit_sizes(plan: EpochPlan, rows: int) -> list[int]:
    """A rank's stream cut into units: whole units, and a last one that keeps a remainder under
    half a batch (which would be a sliver of a batch on its own: see batch_bounds)."""
    sizes = [plan.unit_size] * (rows // plan.unit_size)
    remainder = rows % plan.unit_size
    if remainder and sizes and remainder < (plan.batch_size or plan.unit_size) / 2:
        sizes[-1] += remainder
    elif remainder:
        sizes.append(remainder)
    return sizes


def _resumed_change(plan: EpochPlan, per_epoch: int, units_of: Callable[[int], list[Unit]]) -> int:
    """How many more units (or fewer: negative) the epoch a resumed job continues has than a whole
    one; 0 for a job that was not resumed."""
    if plan.resumed is None:
        return 0
    return len(units_of(plan.resumed.epoch)) - per_epoch


def _remainder(plan: EpochPlan, epoch: int, cuts: tuple[Cut, ...]) -> tuple[list[Segment], tuple[int, ...]]:
    """The rows of `epoch` no rank had stepped at the last of `cuts` (the resumed job's), in order, and
    this plan's rank sizes for them. Each cut is applied to the streams the one before it made."""
    first = cuts[0]
    earlier = replace(plan, world_size=first.world_size, resumed=None, epochs=epoch + 1)
    units = earlier.units(epoch)
    for number, cut in enumerate(cuts):
        left = [segment for rank in range(cut.world_size)
                for segment in _left_of(plan, [u for u in units if u.rank == rank], cut.ranks[rank])]
        world = cuts[number + 1].world_size if number + 1 < len(cuts) else None
        if world is None:
            return left, _split(plan, sum(s.size for s in left), plan.world_size)
        units = list(plan._cut(epoch, left, _split(plan, sum(s.size for s in left), world)))
    raise AssertionError("unreachable: a Resumed has at least one cut")


def _left_of(plan: EpochPlan, stream: list[Unit], position: tuple[int, int]) -> list[Segment]:
    """The rows of one rank's stream not stepped at `position` (units wholly consumed, batches of the
    next): the part of the unit it was in that its seeded order had not reached, then the units
    after it, as runs of rows."""
    index, batches = position
    while index < len(stream) and batches >= len(batch_bounds(stream[index].size, plan.batch_size or
                                                              plan.unit_size)):
        batches -= len(batch_bounds(stream[index].size, plan.batch_size or plan.unit_size))
        index += 1
    if index >= len(stream):
        return []
    part = stream[index]
    taken = batch_bounds(part.size, plan.batch_size or plan.unit_size)[batches][0] if batches else 0
    rows = sorted((shard, row, sample_id - row) for shard, row, sample_id in part.rows(plan.seed)[taken:])
    return _runs(rows) + [s for unit in stream[index + 1:] for s in unit.segments]


def _check_resumed(plan: EpochPlan, resumed: Resumed) -> None:
    """A resume that cannot work is refused with the reason, when the job is made."""
    if not 0 <= resumed.epoch < plan.epochs:
        raise DataError(f"the checkpoint's epoch {resumed.epoch} is not one of the job's epochs "
                         f"0..{plan.epochs - 1}")
    for cut in resumed.cuts:
        if cut.world_size < 1 or len(cut.ranks) != cut.world_size:
            raise DataError(f"a checkpoint of world size {cut.world_size} must hold {cut.world_size} rank "
                             f"positions, not {len(cut.ranks)}")
        if any(units < 0 or batches < 0 for units, batches in cut.ranks):
            raise DataError(f"a checkpoint's rank positions cannot be negative: {list(cut.ranks)}")
    left, sizes = _remainder(plan, resumed.epoch, resumed.cuts)
    if 0 in sizes:
        rows = sum(s.size for s in left)
        raise DataError(f"{rows} samples of epoch {resumed.epoch} are left, fewer than the "
                         f"{plan.world_size} ranks (or a batch each, with drop_last): resume with fewer ranks, "
                         f"or from an earlier checkpoint")


def _runs(rows: list[tuple[int, int, int]]) -> list[Segment]:
    """(shard, row, first sample id of the shard) rows, sorted, as runs of consecutive rows."""
    runs: list[Segment] = []
    for shard, row, first in rows:
        last = runs[-1] if runs else None
        if last is not None and last.shard_index == shard and last.stop == row and last.first_sample_id == first:
            runs[-1] = Segment(shard, last.start, row + 1, first)
        else:
            runs.append(Segment(shard, row, row + 1, first))
    return runs
