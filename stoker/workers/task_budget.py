"""The worker daemon's count of the host's room for the tasks (processes and threads) its decode processes need.

A host under a pids limit (a cgroup's pids.max, ulimit -u, the kernel's threads-max: workers.limits) cannot
start every process, or a process every thread: the daemon does not start one there is no room for, tells a
process's abort for want of a thread from a crash, and says it is short at most every SHORT_SAID_EVERY_S.
"""

from __future__ import annotations

import os
import time
from multiprocessing.process import BaseProcess

from stoker.workers.limits import NPROC, Room, pids_cgroup, task_room

STEADY_S = 10.0  # a process started this long ago holds its threads by now
SHORT_SAID_EVERY_S = 60.0  # a host short of processes or threads says so again at most this often
REFUSAL_COUNTS_S = 5.0  # a process that aborts this soon after its pids cgroup refused a task met the limit
TASKS_PER_PROCESS = 10  # processes and threads one decode process holds (8 measured: its own, zmq's, pyarrow's)


class TaskBudget:
    def __init__(self) -> None:
        self._young: dict[BaseProcess, float] = {}  # processes started lately, and when
        self._short_said_at: float | None = None  # when the host last said it cannot start a process or thread
        self._pids_refused = 0  # the pids cgroup's refusals counted so far (a process's abort after one is no crash)
        self._pids_refused_at: float | None = None  # ... and when that count last grew

    def started(self, process: BaseProcess) -> None:
        self._young[process] = time.monotonic()

    def no_room(self) -> tuple[Room, int] | None:
        """The host's room and the tasks processes starting now will still take, when that leaves less than a
        process needs (it would fail to start, or abort starting a thread); None when there is room."""
        room = task_room()
        if room is None:
            return None
        coming = self.starting_tasks()
        return (room, coming) if room.tasks - coming < TASKS_PER_PROCESS else None

    def starting_tasks(self) -> int:
        """The tasks processes started in the last STEADY_S will still add (they start their threads as they
        import and connect), so a burst of starts does not count the same room twice."""
        now, coming = time.monotonic(), 0
        for process, started in list(self._young.items()):
            if now - started > STEADY_S or not process.is_alive():
                del self._young[process]
                continue
            try:
                coming += max(0, TASKS_PER_PROCESS - len(os.listdir(f"/proc/{process.pid}/task")))
            except OSError:
                continue
        return coming

    def say_short(self) -> bool:
        """Whether to say, now, that the host is short (once, then at most every SHORT_SAID_EVERY_S)."""
        now = time.monotonic()
        if self._short_said_at is None or now - self._short_said_at >= SHORT_SAID_EVERY_S:
            self._short_said_at = now
            return True
        return False

    def refused_a_task(self) -> bool:
        """The pids cgroup refused a fork or thread lately, or the user is near its process limit (a process
        that aborted then met it; several that met it at once are reaped one by one, so a refusal counts
        for REFUSAL_COUNTS_S)."""
        cgroup, room = pids_cgroup(), task_room()
        now = time.monotonic()
        if cgroup is not None and cgroup.refused > self._pids_refused:
            self._pids_refused, self._pids_refused_at = cgroup.refused, now
        elif room is not None and room.limit == NPROC and room.tasks < 2 * TASKS_PER_PROCESS:  # no counter to read:
            self._pids_refused_at = now  # near ulimit -u (counted without the process that died) is the reason
        return self._pids_refused_at is not None and now - self._pids_refused_at <= REFUSAL_COUNTS_S
