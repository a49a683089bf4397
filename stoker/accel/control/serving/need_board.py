"""What the job's ranks measure they need, for a fleet: each rank's last word (its acks carry it; rank 0
in the dispatcher's process says it directly), summed over the ranks heard lately. Pure state on an
injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stoker.accel.control.fleet_member import Need, summed
from stoker.accel.control.serving.last_heard import LastHeard

NEED_FRESH_S = 10.0  # a rank's need older than this is not counted (the rank has gone quiet)


class NeedBoard:
    def __init__(self, now: Callable[[], float] = time.monotonic, fresh_s: float = NEED_FRESH_S) -> None:
        self.now = now
        self.fresh_s = fresh_s
        self._needs: dict[int, Need] = {}  # rank -> what it last said it measures
        self._heard = LastHeard[int]()  # ... and when

    def heard(self, rank: int, need: Need) -> None:
        """What `rank` measures now."""
        self._needs[rank] = need
        self._heard.record(rank, self.now())

    def total(self) -> Need:
        """The job's need: its ranks' (heard within `fresh_s`), summed."""
        return summed([self._needs[rank] for rank in self._heard.heard_within(self.fresh_s, self.now())])
