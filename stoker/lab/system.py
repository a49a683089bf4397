"""Thin wrappers over `ip`, `tc` and the cgroup filesystem, with errors that say what failed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from stoker.protos.errors import ResourceError, StateError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class LabError(StateError):
    """Something the lab needs is missing or refused."""


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def can_use_namespaces() -> str | None:
    """None if network namespaces work here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    probe = "stk-probe"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def netns_list() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_exists(name: str, netns: str | None = None) -> bool:
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", name]
    return run(*cmd, check=False).returncode == 0


# ---- cgroups ------------------------------------------------------------------------------

def cgroup_version() -> int | None:
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists() or (CGROUP_ROOT / "cpu,cpuacct").exists():
        return 1
    return None


def cpu_cgroup_dir(name: str) -> Path | None:
    """Where a CPU-limited group named `name` lives (None: no usable cgroup fs)."""
    version = cgroup_version()
    if version == 2:
        return CGROUP_ROOT / name
    if version == 1:
        v1 = CGROUP_ROOT / "cpu"
        return (v1 if (v1 / "cpu.cfs_quota_us").exists() else CGROUP_ROOT / "cpu,cpuacct") / name
    return None


def make_cpu_cgroup(path: Path, cores: float) -> None:
    """A cgroup allowed `cores` CPUs' worth of time per period (its parent is created too)."""
    quota = int(cores * PERIOD_US)
    if cgroup_version() == 2:  # the cpu controller must be enabled in every ancestor's subtree
        path.parent.mkdir(exist_ok=True)
        for folder in (CGROUP_ROOT, path.parent):
            control = folder / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
        path.mkdir(exist_ok=True)
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(quota))


def remove_cgroup_tree(path: Path) -> None:
    """Remove a cgroup and its children (their processes must be gone)."""
    if not path.exists():
        return
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        child.rmdir()
    path.rmdir()


def cgroup_pids(path: Path) -> list[int]:
    pids: list[int] = []
    for procs in [path / "cgroup.procs", *path.rglob("cgroup.procs")] if path.exists() else []:
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            continue
    return sorted(set(pids))


CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")  # where `ip netns add` keeps its namespaces


def enter_netns(name: str) -> None:
    """Move the calling process into the network namespace `ip netns add` made as `name` (setns(2);
    Python 3.11 has no os.setns)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ResourceError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)
