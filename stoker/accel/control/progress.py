"""What is done, and where every rank's stream stands: the dispatcher's books of progress.

Done units are one number for every whole epoch done plus the ids of the open epochs, so memory
does not grow with the epoch number (ImageNet-1k for 90 epochs is 450,450 units). Beside them,
what every rank's stream has given so far, in batches per unit, so that the dispatcher can say
how many steps an epoch has on every rank and where every rank stands after a step (resume).
Pure state: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.units import Unit


@dataclass(frozen=True)
class RankPositions:
    """Where every rank's stream stands after a step: (units whose batches are all counted, batches consumed
    after them) per rank, and the ranks whose unit's batch count has not come yet while it stands past the
    unit's start (text: it may have stepped the whole unit and more; such a position holds at its own world
    size only, where the rank replays it)."""

    ranks: list[tuple[int, int]]
    unsure: list[int] = field(default_factory=list)
    split: list[int] = field(default_factory=list)  # past its stream's last unit: inside its last batch's pieces

    @property
    def here_only(self) -> list[int]:
        """The ranks whose position cannot be cut for another world size (it holds at this one, by replay)."""
        return sorted({*self.unsure, *self.split})


@dataclass
class Progress:
    plan: EpochPlan
    planned_batches: Callable[[Unit], int | None] | None = None  # images: a unit's batches follow from its size
    done_below: int = 0  # every unit id below this is done: whole epochs
    _done_whole: int = field(init=False, default=0)  # units of those epochs (a resumed epoch has fewer)
    _done_in_epoch: dict[int, int] = field(default_factory=dict)  # open epoch -> its done units
    _done: set[int] = field(default_factory=set)  # done units at or above done_below
    _batches: dict[int, int] = field(default_factory=dict)  # unit -> batches it gave (acked)
    _stream_batches: dict[int, dict[int, int]] = field(default_factory=dict)  # epoch -> rank -> batches
    _prefix: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (epoch, rank) ->
    # (units, batches) a resumed job starts from: those units' counts are not known one by one

    def __post_init__(self) -> None:
        per_epoch = self.plan.units_per_epoch
        self._done_whole = sum(self.plan.units_in(e) for e in range(self.done_below // per_epoch if per_epoch else 0))

    # ---- done units ------------------------------------------------------------------------
    def is_done(self, unit_id: int) -> bool:
        return unit_id < self.done_below or unit_id in self._done

    def mark_done(self, unit_id: int, batches: int | None = None) -> None:
        if batches is not None:
            self._batches[unit_id] = batches
        if self.plan.unit(unit_id) is not None and not self.is_done(unit_id):
            self._done.add(unit_id)
            epoch = unit_id // self.plan.units_per_epoch
            self._done_in_epoch[epoch] = self._done_in_epoch.get(epoch, 0) + 1

    def remember_batches(self, batches: dict[int, int]) -> None:
        self._batches.update(batches)

    def close_done_epochs(self) -> bool:
        """Fold every whole epoch done at the low end into `done_below`; True when one was."""
        per_epoch, closed = self.plan.units_per_epoch, False
        while per_epoch and (self._done_in_epoch.get(self.done_below // per_epoch)
                             == self.plan.units_in(self.done_below // per_epoch)):
            epoch = self.done_below // per_epoch
            self._done.difference_update(range(self.done_below, self.done_below + per_epoch))
            self._done_whole += self.plan.units_in(epoch)
            del self._done_in_epoch[epoch]
            self.done_below += per_epoch
            for unit_id in [u for u in self._batches if u < self.done_below - per_epoch]:
                del self._batches[unit_id]  # the epoch before the open one is kept: positions may ask for it
            for old in [e for e in self._stream_batches if e < epoch]:
                del self._stream_batches[old]
            for key in [k for k in self._prefix if k[0] < epoch]:
                del self._prefix[key]
            closed = True
        return closed

    @property
    def done_count(self) -> int:
        return self._done_whole + len(self._done)

    @property
    def finished(self) -> bool:
        return self.done_count == self.plan.total_units

    def done_units(self) -> list[int]:
        per_epoch = self.plan.units_per_epoch
        if not per_epoch:
            return []
        return [u.unit_id for e in range(self.done_below // per_epoch) for u in self.plan.units(e)] + sorted(self._done)

    def snapshot(self) -> dict:
        return {"done_below": self.done_below, "done": sorted(self._done),
                "batches": {str(u): b for u, b in self._batches.items()}}

    # ---- a rank that starts again ------------------------------------------------------------
    def undo_rank(self, epoch: int, rank: int, units: int) -> int:
        """Take back as not done every unit of `rank`'s stream from its `units`-th of `epoch` on
        (their steps were lost with the consumer that made them); the number taken back."""
        per_epoch = self.plan.units_per_epoch
        while self.done_below > epoch * per_epoch:  # unfold whole epochs done back into ids, to take some back
            closed = self.done_below // per_epoch - 1
            ids = [u.unit_id for u in self.plan.units(closed)]
            self.done_below -= per_epoch
            self._done_whole -= len(ids)
            self._done.update(ids)
            self._done_in_epoch[closed] = len(ids)
        undone = 0
        for e in sorted(k for k in self._done_in_epoch if k >= epoch):
            for unit in self.plan.rank_units(e, rank)[units if e == epoch else 0:]:
                if unit.unit_id not in self._done:
                    continue
                self._done.discard(unit.unit_id)
                self._done_in_epoch[e] -= 1
                self._batches.pop(unit.unit_id, None)
                undone += 1
            if not self._done_in_epoch[e]:
                del self._done_in_epoch[e]
        for e in [k for k in self._stream_batches if k >= epoch]:
            self._stream_batches[e].pop(rank, None)  # it reports its stream's batches again
        return undone

    # ---- where the streams stand ----------------------------------------------------------------
    def batches_of(self, unit: Unit) -> int | None:
        """How many batches a unit gives: from its size (images), or once it has been acked (text)."""
        if self.planned_batches is not None:
            return self.planned_batches(unit)
        return self._batches.get(unit.unit_id)

    def start_at(self, epoch: int, rank: int, units: int, batches_before: int) -> None:
        """`rank`'s stream of `epoch` starts after its first `units` units, which gave `batches_before`."""
        self._prefix[(epoch, rank)] = (units, batches_before)

    def resume_position(self, epoch: int, ranks: Iterable[tuple[int, int]], step: int) -> None:
        """A job resumed at `step` of `epoch`: rank r had consumed its first ranks[r][0] units and
        ranks[r][1] batches after them (the counts of those units need not be known one by one)."""
        for rank, (units, batches) in enumerate(ranks):
            self.start_at(epoch, rank, units, step - batches)

    def epoch_steps(self, epoch: int, rank: int, batches: int) -> int | None:
        """A rank has received its whole stream of `epoch` (`batches` batches); once every rank
        has, the epoch's steps on every rank: the longest stream."""
        reported = self._stream_batches.setdefault(epoch, {})
        reported[rank] = batches
        return max(reported.values()) if len(reported) == self.plan.world_size else None

    def position(self, epoch: int, step: int) -> list[tuple[int, int]]:
        """`where`'s positions alone."""
        return self.where(epoch, step).ranks

    def where(self, epoch: int, step: int) -> RankPositions:
        """Per rank, where its stream stands after `step` steps of `epoch`: (units whose batches are
        all counted, batches consumed after them). A unit whose count is not known yet is not counted:
        at the same world size a resume replays a few more batches, silently; a text rank standing past
        the start of such a unit is named unsure (its count comes with the unit's first batch)."""
        out, unsure, split = [], [], []
        for rank in range(self.plan.world_size):
            index, consumed = self._prefix.get((epoch, rank), (0, 0))
            if consumed > step:
                index, consumed = 0, 0
            stream = self.plan.rank_units(epoch, rank)
            for unit in stream[index:]:
                count = self.batches_of(unit)
                if count is None and consumed < step:
                    unsure.append(rank)
                if count is None or consumed + count > step:
                    break
                consumed += count
                index += 1
            if stream and index == len(stream):  # a short rank splits its last batch: some pieces may be ahead
                split.append(rank)
            out.append((index, step - consumed))
        return RankPositions(out, unsure, split)
