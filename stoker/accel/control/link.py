"""What a consumer rank needs of its job's dispatcher, wherever that runs.

Rank 0 of a job runs the dispatcher in its own process unless told otherwise
(accel.control.local); every other rank, and rank 0 given `--dispatcher`, reaches one in
another process (accel.control.remote). The rank holds either as a `DispatcherLink` and
never asks which: everything is called on the rank's event loop, which owns the books.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import zmq.asyncio

from stoker.accel.control.dispatcher import DispatcherStats
from stoker.accel.control.fleet_member import Need
from stoker.accel.control.progress import RankPositions


@dataclass(frozen=True)
class CloseWait:
    """Something a closing rank waits for, a while: `waiting()` (read on the event loop) is True
    until it has happened."""

    seconds: float
    waiting: Callable[[], bool]
    poll_s: float = 0.05


class DispatcherLink(Protocol):
    total_units: int  # the units this link accounts for (the job's, or this rank's of it)
    need: Callable[[], Need]  # what the rank measures (its consumer sets it); a fleet's job sums its ranks'

    @property
    def control_endpoint(self) -> str:
        """Where workers (and the other ranks) reach the dispatcher; "" before `open`."""
        ...

    @property
    def finished(self) -> bool:
        """Every unit of the job is done (as far as this link has heard)."""
        ...

    def open(self, ctx: zmq.asyncio.Context, data_endpoint: str, on_failure: Callable[[str], None],
             stop: threading.Event, waited_s: Callable[[], float]) -> list[Coroutine[Any, Any, None]]:
        """Bind or connect now (a port in use raises here), with the rank's data socket bound at
        `data_endpoint`; the coroutines returned run on the rank's event loop until `stop`.
        `on_failure(reason)`: the job failed (a worker refused it, or it stalled). `waited_s()`: how
        long the rank has waited for its next batch, told to the dispatcher's stall watchdog."""
        ...

    def close(self) -> None:
        """Close its sockets, on the event loop, once its coroutines are over."""
        ...

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        """Every batch of the unit has been stepped (`batches` of them)."""
        ...

    def received(self, unit_id: int) -> None:
        """Every batch of the unit is at its rank: nobody need make it again."""
        ...

    def counted(self, unit_id: int, batches: int) -> None:
        """A text unit sends `batches` batches (its first is here): a data position after it is exact."""
        ...

    def redo(self, unit_id: int) -> bool:
        """The unit's last batch left samples out: have it made again."""
        ...

    def stats(self) -> DispatcherStats:
        ...

    def hung_s(self) -> float:
        """Seconds worker processes spent in transform calls past --transform-timeout (any thread may ask)."""
        ...

    async def epoch_steps(self, epoch: int, rank: int, batches: int, stop: threading.Event) -> int | None:
        """Report this rank's `batches` of `epoch`; the epoch's steps on every rank once every rank
        has reported, else None (ask again)."""
        ...

    async def position(self, epoch: int, step: int, stop: threading.Event) -> RankPositions | None:
        """Where every rank's stream stands after `step` steps of `epoch` (accel.control.progress), and
        the ranks whose place in a text unit is not sure yet; None when stopped before the answer came."""
        ...

    def close_waits(self, stream_done: bool) -> Iterator[CloseWait]:
        """What a closing rank waits for, in turn, before it stops its loop (`stream_done`: it has
        taken every step of the job)."""
        ...
