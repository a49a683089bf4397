"""What the dispatcher says about ranks that wait: the ones gone silent (said once each), and the stall
watchdog's line (accel.control.watchdog) on who holds what a waiting rank needs, said once per report
bound, on the metrics, and to every rank; past the stall timeout, the job's failure line.

No sockets: the control server (accel.control.serving.server) calls `silent` and `watch` on its tick and fails
the job with the line `watch` returns. The clock is injected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.failures import stalled_line
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.serving.routing import one_line
from stoker.accel.control.watchdog import Watchdog
from stoker.pipeline.activity import PHASES

log = logging.getLogger("stoker.dispatcher")


KNOWN_PHASES = frozenset(PHASES.values()) | {"unknown"}


def phase_label(phase: str) -> str:
    """A holder's phase as a label value: one of a worker's phases (pipeline.activity), or "other" for any
    other text a heartbeat carried (a label fed from a peer's free text would make a series of each)."""
    return phase if phase in KNOWN_PHASES else "other"


class StallReporter:
    def __init__(self, watchdog: Watchdog, metrics: ControlMetrics, now: Callable[[], float] = time.monotonic) -> None:
        self.watchdog = watchdog
        self.metrics = metrics
        self.now = now
        self._silent_reported: set[int] = set()  # ranks said to be silent, until they attach again or speak
        self._finished: set[int] = set()  # of those, the ones whose streams were done when they fell silent
        self._said_at: float | None = None  # when the stall line was last logged

    def attached(self, rank: int) -> None:
        """The rank attached (again): once it falls silent, that is news again."""
        self._silent_reported.discard(rank)
        self._finished.discard(rank)

    def silent(self, ranks: Iterable[int], timeout_s: float, finished: Callable[[int], bool] = lambda rank: False,
               ) -> None:
        """The ranks silent now (Liveness.silent_ranks): each newly silent one is said once, as an error unless
        its stream is `finished` (a rank that stepped its last batch and left is quiet, not lost)."""
        silent = set(ranks)
        self._finished &= silent
        for rank in sorted(silent - self._silent_reported):
            if finished(rank):  # asked once a silence: a rank's last unit may be in an epoch not made yet
                self._finished.add(rank)
                log.info("rank %d stepped the last batch of its stream and has not been heard from since (%.0f s): "
                         "nothing waits for it", rank, timeout_s)
            else:
                log.error("rank %d has not been heard from for %.0f s: its batches wait, and the job cannot finish "
                          "without it (restart every rank from the last state_dict)", rank, timeout_s)
        self._silent_reported = silent
        self.metrics.ranks_silent.set(len(silent - self._finished))

    def watch(self, d: Dispatcher) -> str | None:
        """Say who holds what a waiting rank needs (pace: once per report bound); the job's failure line once
        it has waited the second bound for units that are pending or leased, else None."""
        bounds, waited = self.watchdog.bounds, self.watchdog.waited()
        for rank, seconds in waited.items():
            self.metrics.rank_waiting.labels(rank=str(rank)).set(seconds)
        for rank in set(range(d.plan.world_size)) - set(self.watchdog.waited()):
            self.metrics.rank_waiting.labels(rank=str(rank)).set(0)
        stall = None if d.over else self.watchdog.check(d)
        self.metrics.stall_holders.clear()
        if stall is None:
            d.stall, self._said_at = "", None
            return None
        line = one_line(stall.line)
        d.stall = line
        for h in stall.holders:
            self.metrics.stall_holders.labels(rank=str(h.rank), unit=str(h.unit_id), host=one_line(h.host_id),
                                              process=one_line(h.worker_id), phase=phase_label(h.phase),
                                              sample=str(h.sample_id) if h.sample_id >= 0 else "").set(h.for_s)
        now = self.now()
        if bounds.fail_s and stall.waited_s >= bounds.fail_s and stall.has_work:
            return stalled_line(stall.waited_s, bounds.fail_s, line)
        if self._said_at is None or now - self._said_at >= bounds.report_s:
            self._said_at = now
            log.error("stalled: %s%s", line, f" (the job fails at {bounds.fail_s:g} s: --stall-timeout)"
                      if bounds.fail_s and stall.has_work else "")
        return None
