"""What a worker's work costs in CPU time, and the CPU its process wanted and did not get.

A wall-clock rate measures the neighbours as much as the work: where other processes (or a CPU
quota) take the cores, the same decode takes longer by the clock, not in CPU time. So every
worker stage is timed with `stage_clock`, the CPU time of all of the process's threads (a
transform that starts threads pays for them), and `CpuAccount` adds up, per batch, the process's
whole CPU, how long the thread that makes them sat runnable without a core (the kernel's
schedstat run delay, which includes the time a cgroup CPU quota throttled it), and whether its
cgroup was throttled.

Where the kernel does not give the run delay (no schedstat), the CPU figures still hold and the
wait is reported as not measured, never as zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

stage_clock = time.process_time  # CPU seconds of every thread of this process


def run_delay_s(schedstat: Path = Path("/proc/thread-self/schedstat")) -> float | None:
    """Seconds the calling thread (the one that makes the batches) has waited, runnable, for a core
    since it started: the second field of its schedstat. One thread's, so that the share of its
    runnable time it waited means what it says (a sum over the process's threads would count a
    throttled period once per idle helper thread). None where the kernel does not say."""
    try:
        return int(schedstat.read_bytes().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _cgroup_cpu_stat() -> Path | None:
    """This process's cgroup's cpu.stat (cgroup v2, or v1's cpu controller); None where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat"
        elif "cpu" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup") / controllers / path.lstrip("/") / "cpu.stat"
            if not candidate.exists():
                candidate = Path("/sys/fs/cgroup/cpu") / path.lstrip("/") / "cpu.stat"
        else:
            continue
        if candidate.exists():
            return candidate
    return None


def throttled_periods(stat: Path | None) -> int | None:
    """How many quota periods the cgroup has been throttled in (`nr_throttled`); None where unknown."""
    if stat is None:
        return None
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


@dataclass
class BatchCost:
    """One batch's share of its process: CPU seconds, seconds waited for a core (None: not measured),
    and whether its cgroup's quota throttled it meanwhile."""

    cpu_s: float
    cpu_wait_s: float | None
    throttled: bool


class CpuAccount:
    """Per worker process: `take()` gives what the process spent since the previous `take()` (or since it
    was made), so the batches it sends add up to all of its CPU, leasing and waiting for credit included."""

    def __init__(self) -> None:
        self._stat = _cgroup_cpu_stat()
        self._cpu = stage_clock()
        self._delay = run_delay_s()
        self._throttled = throttled_periods(self._stat)

    def take(self) -> BatchCost:
        cpu, delay, throttled = stage_clock(), run_delay_s(), throttled_periods(self._stat)
        cost = BatchCost(cpu - self._cpu,
                         delay - self._delay if delay is not None and self._delay is not None else None,
                         throttled is not None and self._throttled is not None and throttled > self._throttled)
        self._cpu, self._delay, self._throttled = cpu, delay, throttled
        return cost
