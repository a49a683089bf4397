"""What a worker process is doing right now, where its daemon can read it without asking.

A process stuck in a transform's C code cannot answer anything, and one that segfaults says
nothing more; so each process writes its phase (leasing, reading, transforming a sample,
sending, waiting for credit), the unit and sample it is on, and when it began into a few
shared doubles (`ActivitySlot`) that its daemon made and reads: into its heartbeats (the
dispatcher's stall watchdog says who holds what a waiting rank needs) and, once the process
has died, to name the sample that killed it.

The slot is installed once per process (`install`) and written through `note`, so the code that
reads and transforms samples (pipeline.images.batching) needs no handle passed down; where no slot is
installed (a test, a process of another kind) `note` does nothing. A write is four stores to
shared memory, well under a microsecond; a reader may see a half-written slot, which costs a
wrong line for one heartbeat, never a wrong decision: the daemon reads a dead process's slot,
which nothing writes any more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Phase(IntEnum):
    IDLE = 0
    LEASING = 1  # asking the dispatcher for a unit
    READING = 2  # a sample's bytes from its shard (a fetch from object storage included)
    TRANSFORMING = 3  # decoding and transforming one sample: the user's code
    SENDING = 4  # a batch to its rank's data socket
    WAITING_FOR_CREDIT = 5  # every unit in hand waits for its rank to grant credit


PHASES = {phase: phase.name.lower().replace("_", " ") for phase in Phase}
NONE = -1


@dataclass(frozen=True)
class Activity:
    phase: Phase
    unit_id: int  # NONE when the phase has no unit
    sample_id: int  # NONE when it has no sample
    for_s: float  # seconds in this phase (on this sample)

    @property
    def name(self) -> str:
        return PHASES[self.phase]


class ActivitySlot:
    """Four shared doubles: phase, unit, sample, and since when (time.monotonic, which is one clock
    for every process of the host). Made by the daemon with its multiprocessing context, handed
    to the process it starts."""

    def __init__(self, mp_context: Any) -> None:
        self._cells = mp_context.RawArray("d", 4)
        self.set(Phase.IDLE)

    def set(self, phase: Phase, unit_id: int = NONE, sample_id: int = NONE) -> None:
        cells = self._cells
        cells[3] = time.monotonic()
        cells[1] = unit_id
        cells[2] = sample_id
        cells[0] = phase

    def read(self) -> Activity:
        phase, unit_id, sample_id, since = self._cells[:]
        return Activity(Phase(int(phase)), int(unit_id), int(sample_id), max(0.0, time.monotonic() - since))


_slot: ActivitySlot | None = None


def install(slot: ActivitySlot | None) -> None:
    """This process's slot, written by every `note` from now on."""
    global _slot
    _slot = slot


def note(phase: Phase, unit_id: int = NONE, sample_id: int = NONE) -> None:
    """Record what this process does now (nothing when no slot is installed)."""
    if _slot is not None:
        _slot.set(phase, unit_id, sample_id)
