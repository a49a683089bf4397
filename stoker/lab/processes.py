"""The lab's processes: started in a host's namespace and cgroup, watched, signalled, and their CPU time."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from stoker.lab.state import LabState, Member
from stoker.lab.system import LabError, enter_netns


def wait_for_metrics(member: Member, what: str, timeout_s: float = 60.0) -> None:
    """Until `member` serves its /metrics; LabError with its log's tail when it exits first or is late."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(member.pid):
            raise LabError(f"{what} exited at start; its log ({member.log}):\n{_tail(member.log)}")
        try:
            urllib.request.urlopen(member.metrics, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise LabError(f"{what} did not come up within {timeout_s:.0f} s; see {member.log}")


def _member(state: LabState, name: str) -> Member:
    if name not in state.members:
        raise LabError(f"no member {name!r}; the lab has {', '.join(state.members)}")
    return state.members[name]


def _spawn(cmd: list[str], netns: str | None, cgroup: Path | None, log_path: Path) -> int:
    """Start a process in its own session, network namespace and cgroup; its pid. The namespace is
    entered with setns, not `ip netns exec`, which mounts a sysfs of its own over /sys and so hides
    /sys/fs/cgroup: a worker must see its cgroup's cpu.stat, as it does in a container, to tell a CPU
    quota from other processes taking its cores (pipeline.cpu_clock)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def enter() -> None:  # in the child, before exec: its children inherit the group and the namespace
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if netns is not None:
            enter_netns(netns)

    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=enter, env=env)
    return proc.pid


def hosts_cpu_seconds(state: LabState) -> float:
    """CPU seconds used so far by the worker hosts' live processes (each host is a session of its own)."""
    sessions = {m.pid for name, m in state.members.items() if name != "accel" and m.pid is not None}
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) in sessions:  # fields[3]: the session id (field 6 of proc(5))
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except (ProcessLookupError, FileNotFoundError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        _kill(pid, sig)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
