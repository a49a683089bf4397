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

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property

from stoker.pipeline.remainder import Left, Resumed, check_resumed, remainder
from stoker.pipeline.seeds import derived_rng
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.mixture import MIXTURE, Schedule
from stoker.pipeline.units import Segment, Unit, split_rows
from stoker.protos.errors import ConfigError

_UNIT_ORDER_KEY = "unit-order"
_CACHE_LOCK = threading.Lock()  # every plan's epoch cache: trims are rare and quick, one lock serves all


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
    unit_batches: int = 0  # text: the batches a unit is made for, whose rows come from its documents together
    # (what a rank had not stepped of one is the unit less its stepped batches: pipeline.remainder); 0: images

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
            check_resumed(self, self.resumed, self.resumed_left)

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
        return split_rows(rows, self.world_size, self.drop_last_batch)

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
        """Unit ids of epoch e start at e times this: the units of a whole epoch, every rank's (a mixture: the
        most any epoch has), or of the epoch a resumed text job continues where that has more (its part-stepped
        units go beside the units its documents are cut into)."""
        whole = max(sum(counts) for counts in self._mixture_units) if self._mixture is not None else \
            sum(self.units_per_rank)
        if self.resumed is None or not self.unit_batches:
            return whole
        left = self.resumed_left
        return max(whole, sum(1 for _ in self.cut(self.resumed.epoch, left.runs, left.sizes, left.tails, 0)))

    def units_in(self, epoch: int) -> int:
        """How many units `epoch` has: a whole epoch's, or fewer (or, text, more) in the epoch a resumed job
        continues (unit ids of epoch e start at e * units_per_epoch whatever their number)."""
        if self.resumed is not None and epoch == self.resumed.epoch:
            return len(self._units(epoch))
        if self._mixture is None:
            return sum(self.units_per_rank)
        return sum(self._mixture_units[epoch]) if epoch < self.epochs else 0  # past the last epoch: none

    @cached_property
    def total_units(self) -> int:
        """Units of the whole job: counted, not summed epoch by epoch (a job of 2**31 - 1 epochs, the
        most --epochs takes, spent some 5 minutes here before its first lease)."""
        if self._mixture is not None:
            return sum(self.units_in(epoch) for epoch in range(self.epochs))
        whole = sum(self.units_per_rank)
        return whole * self.epochs + _resumed_change(self, whole, self.units)

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

    @cached_property
    def resumed_left(self) -> Left:
        """What the epoch a resumed job continues still owes, laid out for this world size."""
        if self.resumed is None:
            return Left([], (), ())
        epoch, cuts = self.resumed.epoch, self.resumed.cuts
        first = replace(self, world_size=cuts[0].world_size, resumed=None, epochs=epoch + 1).units(epoch)
        return remainder(self, epoch, cuts, first)

    @property
    def drop_last_batch(self) -> int:
        """With drop_last, the batch every rank's stream is a whole number of; 0 without."""
        return (self.batch_size or self.unit_size) if self.drop_last else 0

    def _make_units(self, epoch: int) -> Iterator[Unit]:
        if self.resumed is not None and epoch == self.resumed.epoch:
            left = self.resumed_left
            yield from self.cut(epoch, left.runs, left.sizes, left.tails)
            return
        blocks = self._blocks if self._mixture is None else \
            tuple(Segment(*run) for run in self._mixture.runs(self.seed, epoch))
        order = derived_rng(self.seed, epoch, _UNIT_ORDER_KEY).permutation(len(blocks))
        yield from self.cut(epoch, [blocks[int(i)] for i in order], self.epoch_rank_sizes(epoch))

    def cut(self, epoch: int, stream: list[Segment], sizes: tuple[int, ...],
            tails: tuple[tuple[Unit, ...], ...] = (), first_id: int | None = None) -> Iterator[Unit]:
        """`stream` (runs of rows, in order) cut into consecutive rank streams of `sizes` rows, each cut
        into units, after the rank's `tails` (text units part-stepped at another world size, which keep
        their documents and skip). Unit ids from `first_id` (default: the epoch's first)."""
        made = epoch * self.units_per_epoch if first_id is None else first_id
        cursor = 0  # index into stream
        offset = 0  # rows of stream[cursor] already taken
        for rank, size in enumerate(sizes):
            own = tails[rank] if tails else ()
            for position, tail in enumerate(own):
                yield replace(tail, unit_id=made, rank=rank, position=position)
                made += 1
            for position, want in enumerate(_unit_sizes(self, size), start=len(own)):
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
                yield Unit(made, epoch, tuple(segments), rank, position)
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
