"""Why this host cannot start another process or thread, in one line that says what to change.

fork, clone and pthread_create fail with EAGAIN for several reasons that look the same from
Python ("[Errno 11] Resource temporarily unavailable", "can't start new thread"): a cgroup's
pids limit (a container's or a systemd unit's TasksMax), the user's process limit (ulimit -u),
the kernel's threads-max, or memory for the new task's stack. The daemon reads which one it
is, so the line names the limit and its figures instead of the errno.
"""

from __future__ import annotations

import errno
import os
import resource
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1's pids hierarchy, then v2's
NEAR = 0.9  # a pids limit this full counts as met (other tasks come and go while we look)


@dataclass(frozen=True)
class PidsCgroup:
    """This process's pids cgroup: its limit, what it holds now, and how many forks it has refused."""

    path: Path
    limit: int | None  # None: "max"
    current: int
    refused: int  # pids.events "max": fork or clone calls the limit refused so far

    def met(self) -> bool:
        """The limit is set and was reached: it refused a task, or holds nearly as many as it allows."""
        return self.limit is not None and (self.refused > 0 or self.current >= NEAR * self.limit)

    def room(self) -> int | None:
        """Tasks it may still start (None: no limit)."""
        return None if self.limit is None else max(0, self.limit - self.current)


def pids_cgroup() -> PidsCgroup | None:
    """The pids cgroup this process is in (v1 or v2), or None where none can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "pids" not in controllers.split(",") and not (controllers == "" and rel):
            continue
        for root in CGROUP_ROOTS:
            folder = root / rel.lstrip("/")
            if (folder / "pids.current").exists():
                return _read(folder)
    return None


def _read(folder: Path) -> PidsCgroup | None:
    try:
        raw = (folder / "pids.max").read_text().strip() if (folder / "pids.max").exists() else "max"
        current = int((folder / "pids.current").read_text())
        events = (folder / "pids.events").read_text() if (folder / "pids.events").exists() else ""
    except (OSError, ValueError):
        return None
    refused = next((int(word) for key, word in (line.split() for line in events.splitlines() if line.strip())
                    if key == "max"), 0)
    return PidsCgroup(folder, None if raw == "max" else int(raw), current, refused)


@dataclass(frozen=True)
class Room:
    """How many more tasks (processes and threads) this host lets the daemon start, and which limit says so."""

    tasks: int
    limit: str  # PIDS or NPROC


PIDS, NPROC = "pids", "nproc"


def task_room() -> Room | None:
    """The tightest of this process's pids cgroup and its user's process limit (ulimit -u, which root is
    not held to); None where neither is set."""
    rooms = []
    cgroup = pids_cgroup()
    if cgroup is not None and cgroup.room() is not None:
        rooms.append(Room(cgroup.room() or 0, PIDS))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:
        tasks = _user_tasks()
        if tasks is not None:
            rooms.append(Room(max(0, soft - tasks), NPROC))
    return min(rooms, key=lambda room: room.tasks, default=None)


def is_out_of_tasks(exc: BaseException) -> bool:
    """`exc` is a failure to start a process or thread for want of a resource (not a bug)."""
    if isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.ENOMEM):
        return True
    text = str(exc)
    return "can't start new thread" in text or "Failed to launch worker thread" in text or \
        "Resource temporarily unavailable" in text


def out_of_tasks_line(what: str, short: Room | None = None, near: int = 0) -> str:
    """One line: `what` (e.g. "cannot start worker process h0/p3") failed, which limit it met, and what to
    change. `short`: the limit that had no room for another process (nothing was tried); `near`: a limit
    within this many tasks of full counts as met (a process's worth: its tasks are gone once it died)."""
    cgroup = pids_cgroup()
    if cgroup is not None and ((short is not None and short.limit == PIDS) or cgroup.met()):
        return (f"{what}: this host's pids limit is reached ({cgroup.current} of {cgroup.limit} processes and threads "
                f"in cgroup {cgroup.path}): raise pids.max (TasksMax= for a systemd unit, --pids-limit for a "
                f"container) or run fewer --procs")
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    tasks = _user_tasks()
    if soft != resource.RLIM_INFINITY and tasks is not None and (
            (short is not None and short.limit == NPROC) or tasks >= min(NEAR * soft, soft - near)):
        return (f"{what}: this user's process limit is reached ({tasks} of {soft} processes and threads, ulimit -u): "
                f"raise it (LimitNPROC= for a systemd unit) or run fewer --procs")
    threads_max = _int(Path("/proc/sys/kernel/threads-max"))
    if threads_max is not None and tasks is not None and tasks >= NEAR * threads_max:
        return f"{what}: the kernel's threads-max ({threads_max}) is reached: raise it or run fewer --procs"
    return (f"{what}: the system refused a new process or thread (out of memory for its stack, or a limit not "
            f"readable here: pids.max of this cgroup, ulimit -u, kernel.threads-max): free memory or run fewer --procs")


def _user_tasks() -> int | None:
    """Processes and threads of this user (what RLIMIT_NPROC counts), from /proc; None where unreadable."""
    uid, count = os.getuid(), 0
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
                except OSError:
                    continue
    except OSError:
        return None
    return count


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
