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

import os
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
        return _run_delay(schedstat.read_bytes())
    except OSError:
        return None


def _run_delay(schedstat: bytes) -> float | None:
    try:
        return int(schedstat.split()[1]) / 1e9
    except (IndexError, ValueError):
        return None


class _KernelFile:
    """A /proc or /sys file kept open and read again from its start (os.pread): a worker reads two of
    them per batch, and opening each anew cost about 1% of a text worker's CPU. The fd of
    /proc/thread-self/... stays the opening thread's. `read()` is None once the file fails."""

    def __init__(self, path: Path | None) -> None:
        self.fd: int | None = None
        if path is not None:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = None

    def read(self) -> bytes | None:
        if self.fd is None:
            return None
        try:
            return os.pread(self.fd, 4096, 0)
        except OSError:
            self.close()
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _cgroup_cpu_dir() -> Path | None:
    """This process's cgroup folder for CPU (cgroup v2, or v1's cpu controller); None where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/")
        elif "cpu" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            if not (candidate / "cpu.stat").exists():
                candidate = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
        else:
            continue
        if (candidate / "cpu.stat").exists():
            return candidate
    return None


def _cgroup_cpu_stat() -> Path | None:
    folder = _cgroup_cpu_dir()
    return folder / "cpu.stat" if folder is not None else None


def _quota_cores(folder: Path) -> float | None:
    """The CPU quota one cgroup folder sets, in cores (None: none, or unreadable)."""
    try:
        if (folder / "cpu.max").exists():  # v2: "max 100000" or "<quota> <period>"
            quota, period = (folder / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((folder / "cpu.cfs_quota_us").read_text())
        return None if quota_us < 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def machine_id() -> str:
    """The machine this process runs on, as the kernel names this boot: processes in network namespaces
    or cgroups of one machine (the lab's emulated hosts) give the same id, separate machines do not."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def usable_cores() -> float:
    """The cores this process may run on: its CPU affinity, or the tightest CPU quota of its cgroup and
    the cgroups above it where that is lower. Workers report it, so that a consumer can tell workers that
    fill their own host (more processes than cores: short of cores) from neighbours taking the CPU."""
    cores = float(len(os.sched_getaffinity(0)))
    folder = _cgroup_cpu_dir()
    while folder is not None and folder != folder.parent and folder.name not in ("cgroup", "cpu", "cpu,cpuacct"):
        quota = _quota_cores(folder)
        if quota is not None:
            cores = min(cores, quota)
        folder = folder.parent
    return cores


def throttled_periods(stat: Path | None) -> int | None:
    """How many quota periods the cgroup has been throttled in (`nr_throttled`); None where unknown."""
    if stat is None:
        return None
    try:
        return _nr_throttled(stat.read_bytes())
    except OSError:
        return None


def _nr_throttled(stat: bytes | None) -> int | None:
    if stat is None:
        return None
    for line in stat.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            try:
                return int(value)
            except ValueError:
                return None
    return None


@dataclass
class BatchCost:
    """One batch's share of its process: CPU seconds, seconds waited for a core (None: not measured),
    and whether its cgroup's quota throttled it meanwhile."""

    cpu_s: float
    cpu_wait_s: float | None
    throttled: bool
    cores: float  # the cores the process may run on (usable_cores), read when its account was made
    machine: str = ""  # machine_id()
    machine_cores: float = 0.0  # its CPU affinity alone: the machine's cores it shares with other hosts there


class CpuAccount:
    """Per worker process: `take()` gives what the process spent since the previous `take()` (or since it
    was made), so the batches it sends add up to all of its CPU, leasing and waiting for credit included."""

    def __init__(self) -> None:
        """Made by the thread that makes the batches: its run delay is the one read."""
        self._schedstat = _KernelFile(Path("/proc/thread-self/schedstat"))
        self._stat = _KernelFile(_cgroup_cpu_stat())
        self.cores = usable_cores()
        self.machine, self.machine_cores = machine_id(), float(len(os.sched_getaffinity(0)))
        self._cpu, self._delay, self._throttled = self._now()

    def _now(self) -> tuple[float, float | None, int | None]:
        schedstat = self._schedstat.read()
        return (stage_clock(), _run_delay(schedstat) if schedstat is not None else None,
                _nr_throttled(self._stat.read()))

    def take(self) -> BatchCost:
        cpu, delay, throttled = self._now()
        cost = BatchCost(cpu - self._cpu,
                         delay - self._delay if delay is not None and self._delay is not None else None,
                         throttled is not None and self._throttled is not None and throttled > self._throttled,
                         self.cores, self.machine, self.machine_cores)
        self._cpu, self._delay, self._throttled = cpu, delay, throttled
        return cost

    def close(self) -> None:
        self._schedstat.close()
        self._stat.close()
