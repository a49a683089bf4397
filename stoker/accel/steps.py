"""Every rank takes the same number of steps each epoch, and a resume skips the steps already taken.

A rank's stream may hold one batch fewer than another's (the plan splits the samples to within
one; text packs to a number of rows nobody knows in advance). Waiting at an epoch end for the
longest stream's length (`steps_of`), the rank splits its last batch into as many pieces as
it is short, so a DDP job cannot hang at an epoch boundary: never a repeated sample, never a
padded one; only a rank with fewer rows than steps (a tiny set) gets empty pieces, marked by
their zero rows. A resumed epoch begins with the steps the checkpoint had already taken: they
arrive again from the workers (byte-identical) and are accounted for, not stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from stoker.accel.batch import ReceivedBatch
from stoker.accel.stream import EpochEnd


@dataclass
class Scheduled:
    """One step: a whole received batch, or a piece of one."""

    batch: ReceivedBatch
    epoch: int
    step: int  # within the epoch, from 0
    closes: ReceivedBatch | None  # after this step, the received batch whose books are done
    last: bool = False  # the epoch's last step: once taken, the job's position is the next epoch's start


@dataclass
class EpochDone:
    """The end of an epoch's steps, and how many every rank took."""

    epoch: int
    steps: int


class StepSchedule:
    """Turns a rank's ordered stream into steps: the same number on every rank each epoch (a short
    rank splits its last batch), and a resume's steps already taken accounted for, not stepped."""

    def __init__(self, source: Callable[[], object], end: object, steps_of: Callable[[int, int], int],
                 replayed: Callable[[ReceivedBatch], None], epoch: int = 0, step: int = 0,
                 replay_steps: int = 0) -> None:
        """`source()`: the next ReceivedBatch, EpochEnd or `end` from the rank's ordered stream;
        `steps_of(epoch, batches)`: the epoch's steps on every rank, given this rank's batches;
        `replayed(batch)`: account for a batch stepped before the resume. A resumed stream starts
        at `step` of `epoch` (the steps of the units before it), of which `replay_steps` more
        were taken before the checkpoint."""
        self.source = source
        self.end = end
        self.steps_of = steps_of
        self.replayed = replayed
        self.epoch = epoch
        self.step = step
        self.replay_steps = replay_steps  # steps of the first epoch already taken before a resume
        self._held: ReceivedBatch | None = None  # the last batch of an epoch, until its length is known
        self._ready: list[Scheduled | EpochDone] = []

    def next(self) -> Scheduled | EpochDone | object:
        """The next step, the end of an epoch, or the source's `end`."""
        while True:
            while self._ready:
                ready = self._ready.pop(0)
                if isinstance(ready, Scheduled) and self._replaying():
                    self.replay_steps -= 1
                    if ready.closes is not None:
                        self.replayed(ready.closes)
                    continue
                return ready
            item = self.source()
            if item is self.end:
                if self._held is not None:  # stopped early (time box): the held batch still steps
                    self._emit([self._held], self._held)
                    self._held = None
                    continue
                return self.end
            if isinstance(item, EpochEnd):
                self._close_epoch(item)
                continue
            batch = cast(ReceivedBatch, item)  # source's contract: neither `end` nor an EpochEnd is a batch
            if batch.ends_epoch:
                self._held = batch
            else:
                self._emit([batch], batch)

    def _replaying(self) -> bool:
        return self.replay_steps > 0

    def _emit(self, pieces: list[ReceivedBatch], whole: ReceivedBatch) -> None:
        for i, piece in enumerate(pieces):
            self._ready.append(Scheduled(piece, self.epoch, self.step, whole if i == len(pieces) - 1 else None))
            self.step += 1

    def _close_epoch(self, end: EpochEnd) -> None:
        steps = self.steps_of(end.epoch, end.batches)
        last = self._held
        self._held = None
        if last is not None:
            self._emit(last.split(steps - end.batches + 1) if steps > end.batches else [last], last)
        if self._ready and isinstance(self._ready[-1], Scheduled):
            self._ready[-1].last = True
        self._ready.append(EpochDone(end.epoch, steps))
        self.epoch, self.step = end.epoch + 1, 0
