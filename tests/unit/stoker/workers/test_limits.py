"""workers.limits: which limit a host met when it could not start a process or thread, read from files."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from stoker.workers import limits
from stoker.workers.limits import PidsCgroup, _read, is_out_of_tasks, out_of_tasks_line


def _cgroup(folder: Path, limit: str, current: int, refused: int | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pids.max").write_text(f"{limit}\n")
    (folder / "pids.current").write_text(f"{current}\n")
    if refused is not None:
        (folder / "pids.events").write_text(f"max {refused}\n")
    return folder


def test_a_pids_cgroup_is_read_with_its_limit_use_and_refusals(tmp_path):
    assert _read(_cgroup(tmp_path / "a", "25", 24, 3)) == PidsCgroup(tmp_path / "a", 25, 24, 3)
    unlimited = _read(_cgroup(tmp_path / "b", "max", 400, None))
    assert unlimited is not None and unlimited.limit is None and not unlimited.met() and unlimited.room() is None
    assert _read(_cgroup(tmp_path / "c", "25", 3, 1)).met()  # it refused a task: met, however empty it is now
    assert not _read(_cgroup(tmp_path / "d", "25", 3, 0)).met() and _read(tmp_path / "d").room() == 22


@pytest.mark.parametrize("exc, out", [
    (BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"), True),
    (RuntimeError("can't start new thread"), True),
    (Exception("Unknown error: Failed to launch worker thread: Resource temporarily unavailable"), True),
    (OSError(errno.ENOENT, "No such file"), False),
    (RuntimeError("something else"), False)])
def test_only_a_failure_to_start_a_task_counts_as_the_host_out_of_them(exc, out):
    assert is_out_of_tasks(exc) is out


def test_the_line_names_the_pids_limit_and_what_to_change(monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "pids_cgroup", lambda: PidsCgroup(tmp_path, 25, 25, 4))
    line = out_of_tasks_line("cannot start worker process h0/p3")
    assert line.startswith("cannot start worker process h0/p3: this host's pids limit is reached (25 of 25 ")
    assert "raise pids.max" in line and "fewer --procs" in line and "\n" not in line


def test_without_a_limit_met_the_line_says_what_it_could_be(monkeypatch):
    monkeypatch.setattr(limits, "pids_cgroup", lambda: None)
    monkeypatch.setattr(limits, "_user_tasks", lambda: 10)
    line = out_of_tasks_line("cannot start worker process h0/p3")
    assert "out of memory" in line and "ulimit -u" in line and "fewer --procs" in line


def test_the_room_is_the_tightest_limits(monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "pids_cgroup", lambda: PidsCgroup(tmp_path, 25, 22, 0))
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (40, 40))
    monkeypatch.setattr(limits.os, "geteuid", lambda: 1000)  # root is not held to ulimit -u
    monkeypatch.setattr(limits, "_user_tasks", lambda: 39)
    assert limits.task_room() == limits.Room(1, limits.NPROC)
    monkeypatch.setattr(limits, "_user_tasks", lambda: 10)
    assert limits.task_room() == limits.Room(3, limits.PIDS)
    monkeypatch.setattr(limits.os, "geteuid", lambda: 0)
    monkeypatch.setattr(limits, "pids_cgroup", lambda: None)
    assert limits.task_room() is None


def test_a_user_within_a_process_of_its_limit_is_named_as_out_of_it(monkeypatch):
    """26 of 30 tasks is under 90%, but the process that failed held the other four when it died."""
    monkeypatch.setattr(limits, "pids_cgroup", lambda: None)
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (30, 30))
    monkeypatch.setattr(limits, "_user_tasks", lambda: 26)
    assert "this user's process limit is reached (26 of 30" in out_of_tasks_line("x", near=10)
    assert "ulimit -u" in out_of_tasks_line("x", limits.Room(0, limits.NPROC))
    assert "out of memory" in out_of_tasks_line("x")
