"""What an epoch's cuts leave: the work a job resumed at another world size still owes the epoch.

At a cut (a checkpoint of N ranks resumed by M), each old rank had consumed some units of its
stream and some batches of the next. What no rank had stepped is cut into M new streams:

- Images: a unit's batches follow from its rows, so the rows a rank had not stepped (what its
  seeded order had not reached of the unit it was in, then the units after it) are runs of rows,
  cut into M streams whose sizes differ by at most one row, as a whole epoch is.
- Text: a unit's rows are made from its documents together (examples, packing, a `concat`
  stream), so the part of a unit a rank had not stepped is no set of documents. It is named as
  the unit itself less the batches stepped (`Unit.skip`): a worker makes it again, the same way
  (it depends only on its documents, the seed and the epoch) and sends the rest. Such tails go
  first in the new streams, each to the stream with the least work so far; the documents of the
  units nobody had started are cut as images' rows are, in amounts that even the streams out
  (a tail counts for the documents its unsent batches hold, estimated from the batches the cut's
  ranks saw a unit give). Steps stay equal whatever the estimate: a short rank splits its last
  batch (accel.steps).

A chain of cuts (4 ranks, then 3, then 5 in one epoch) applies each to the streams the one before
made; a tail part-stepped again adds to its skip. `Cut` is one checkpoint's place, `Resumed` the
chain a job carries (JobConfig.resumed_from); the plan (pipeline.plan) builds on this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from stoker.pipeline.units import Segment, Unit, batch_bounds, split_rows
from stoker.protos.errors import DataError


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


class Planner(Protocol):
    """What this module asks of the epoch plan (pipeline.plan.EpochPlan), which builds on it."""

    @property
    def unit_size(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def unit_batches(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def drop_last_batch(self) -> int: ...

    def cut(self, epoch: int, stream: list[Segment], sizes: tuple[int, ...],
            tails: tuple[tuple[Unit, ...], ...] = (), first_id: int | None = None) -> Iterator[Unit]: ...


@dataclass(frozen=True)
class Left:
    """What the cuts leave, for the plan's world size: runs of rows and the rows of each rank's stream,
    and (text) each rank's part-stepped units, which its stream takes first."""

    runs: list[Segment]
    sizes: tuple[int, ...]
    tails: tuple[tuple[Unit, ...], ...]


def remainder(plan: Planner, epoch: int, cuts: tuple[Cut, ...], units: list[Unit]) -> Left:
    """What no rank had stepped of `epoch` at the last of `cuts`, laid out for `plan`'s world size; `units`:
    the epoch's units at the first cut's world size. Each cut is applied to the streams the one before it made."""
    worlds = [cut.world_size for cut in cuts[1:]] + [plan.world_size]
    left = Left([], (), ())
    offset = 0  # steps of the epoch before the streams `units` holds
    for number, (cut, world) in enumerate(zip(cuts, worlds, strict=True)):
        if number:
            units = list(plan.cut(epoch, left.runs, left.sizes, left.tails, first_id=0))
        items: list[Segment | Unit] = [item for rank in range(cut.world_size)
                                       for item in _left_of(plan, [u for u in units if u.rank == rank],
                                                            cut.ranks[rank])]
        left = _lay_out(plan, items, world, _unit_batches_seen(plan, cut, cut.step - offset))
        offset = cut.step
    return left


def _unit_batches_seen(plan: Planner, cut: Cut, steps: int) -> float:
    """The batches a text unit gives, as the cut's ranks saw them: the steps they took over the units they
    wholly stepped (a unit of long documents gives many more than the `unit_batches` it was sized for), and
    never fewer than any rank had stepped of its unit."""
    whole = sum(units for units, _ in cut.ranks)
    seen = sum(steps - batches for units, batches in cut.ranks if units) / whole if whole else 0.0
    return max(float(plan.unit_batches), seen, *(batches + 1.0 for _, batches in cut.ranks))


def check_resumed(plan: Planner, resumed: Resumed, left: Left) -> None:
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
    empty = [rank for rank, size in enumerate(left.sizes) if size == 0 and not left.tails[rank]]
    if empty:
        rows = sum(s.size for s in left.runs)
        tails = sum(len(t) for t in left.tails)
        held = f"{rows} samples" + (f" and {tails} part-stepped units" if tails else "")
        raise DataError(f"{held} of epoch {resumed.epoch} are left, fewer than the {plan.world_size} ranks (or a "
                         f"batch each, with drop_last): resume with fewer ranks, or from an earlier checkpoint")


def _left_of(plan: Planner, stream: list[Unit], position: tuple[int, int]) -> list[Segment | Unit]:
    """What one rank's stream had not stepped at `position` (units wholly consumed, batches of the
    next), as runs of rows and (text) units less their stepped batches."""
    if plan.unit_batches:
        return _text_left_of(stream, position)
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
    return [*_runs(rows), *(s for unit in stream[index + 1:] for s in unit.segments)]


def _text_left_of(stream: list[Unit], position: tuple[int, int]) -> list[Segment | Unit]:
    """A text rank's remainder: the unit it was in, less the batches it had stepped (the position is
    exact: accel.control.progress waits for every unit's batch count), then the units after it. A unit
    nobody had started is its documents; one part-stepped at an earlier cut stays a unit."""
    index, batches = position
    if index >= len(stream):
        return []
    head = stream[index]
    if batches:
        head = replace(head, skip=head.skip + batches)
    return [item for unit in (head, *stream[index + 1:])
            for item in ((unit,) if unit.skip else unit.segments)]


def _lay_out(plan: Planner, items: list[Segment | Unit], world: int, unit_batches: float) -> Left:
    """`items` for `world` ranks: each part-stepped unit to the rank with the least work so far, then
    the runs' rows in amounts that even the ranks out (images: rows differing by at most one). A text
    unit part-stepped counts for its documents in proportion to the batches it has left of `unit_batches`
    (at least one)."""
    runs = [item for item in items if isinstance(item, Segment)]
    total = sum(s.size for s in runs)
    tails: list[list[Unit]] = [[] for _ in range(world)]
    if not plan.unit_batches:
        return Left(runs, split_rows(total, world, plan.drop_last_batch), tuple(() for _ in range(world)))
    load = [0.0] * world
    for tail in (item for item in items if isinstance(item, Unit)):
        rank = min(range(world), key=lambda r: (load[r], r))
        tails[rank].append(tail)
        load[rank] += tail.size * max(1.0, unit_batches - tail.skip) / unit_batches
    return Left(runs, _evened(load, total), tuple(tuple(t) for t in tails))


def _evened(load: list[float], total: int) -> tuple[int, ...]:
    """`total` rows shared so that load + rows is as even as it can be (water filling), in whole rows."""
    order = sorted(range(len(load)), key=lambda r: (load[r], r))
    level, below = 0.0, 0.0
    for count, rank in enumerate(order, start=1):
        below += load[rank]
        level = (total + below) / count
        if count == len(order) or level <= load[order[count]]:
            break
    rows = [max(0, int(level - load[r])) for r in range(len(load))]
    for rank in sorted(range(len(load)), key=lambda r: (load[r] + rows[r], r))[:total - sum(rows)]:
        rows[rank] += 1
    return tuple(rows)


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
