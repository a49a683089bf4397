"""stoker/workers/supervisor.py, with real short-lived child processes: a child starts, one that crashes starts
again after its back-off (growing with crashes in a row), and a drain ends at its deadline, killing the child
that did not stop and saying what it waited for."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

from stoker.workers.supervisor import KILL_WAIT_S, Supervised, Supervisor
from tests.helpers import wait_for


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _crash(code: int) -> None:
    os._exit(code)


def _deaf(ready: Any) -> None:
    """Ignores SIGTERM (a child that does not drain)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def _supervisor(backoff: tuple[float, ...] = (0.0,), steady_s: float = 10.0, exited: list[int] | None = None):
    return Supervisor(mp.get_context("spawn"), backoff, steady_s,
                      on_exit=exited.append if exited is not None else None)


def test_a_child_starts_and_is_reaped_with_its_exit_code_once_it_exits():
    exited: list[int] = []
    procs, child = _supervisor(exited=exited), Supervised()
    process = procs.start(child, _sleep, (0.5,), "sleeper")
    assert child.process is process and process.name == "sleeper" and process.is_alive()
    assert child.started > 0 and child.restart_at is None
    assert procs.reap(child) is None  # it runs
    assert wait_for(lambda: procs.reap(child) == 0, timeout=30)
    assert exited == [process.pid]
    assert procs.reap(Supervised()) is None  # never started: nothing to reap


def test_a_crash_is_restarted_after_its_back_off_which_grows_with_crashes_in_a_row():
    procs, child = _supervisor(backoff=(0.3, 1.0)), Supervised()
    first = procs.start(child, _crash, (3,), "crasher")
    assert wait_for(lambda: procs.reap(child) == 3, timeout=30)
    crashed_at = time.monotonic()
    assert procs.crashed(child) == 0.3 and child.crashes == 1
    assert not procs.due(child)  # waiting out its back-off
    assert wait_for(lambda: procs.due(child), timeout=10)
    assert time.monotonic() - crashed_at >= 0.3
    second = procs.start(child, _crash, (4,), "crasher")
    assert second.pid != first.pid and child.restart_at is None
    assert wait_for(lambda: procs.reap(child) == 4, timeout=30)
    assert procs.crashed(child) == 1.0 and child.crashes == 2  # again within steady_s: a longer wait
    assert procs.crashed(child) == 1.0  # the last back-off holds from there on


def test_a_child_that_ran_steadily_before_it_crashed_counts_from_one_again():
    procs, child = _supervisor(backoff=(0.0, 5.0), steady_s=0.0), Supervised()
    procs.start(child, _crash, (3,), "crasher")
    assert wait_for(lambda: procs.reap(child) == 3, timeout=30)
    child.crashes = 4
    assert procs.crashed(child) == 0.0 and child.crashes == 1 and procs.due(child)


def test_a_drain_ends_at_its_deadline_kills_the_child_that_did_not_stop_and_says_what_it_waited_for():
    exited: list[int] = []
    procs = _supervisor(exited=exited)
    ready = mp.get_context("spawn").Event()
    polite, deaf, done = Supervised(), Supervised(), Supervised()
    procs.start(polite, _sleep, (60,), "polite")
    procs.start(deaf, _deaf, (ready,), "deaf")
    procs.start(done, _crash, (0,), "done")
    assert ready.wait(30) and wait_for(lambda: procs.reap(done) == 0, timeout=30)
    late: list[Supervised] = []
    started = time.monotonic()
    drained = procs.drain([polite, deaf, done], timeout_s=1.0, on_late=late.append)
    took = time.monotonic() - started
    assert 1.0 <= took < 1.0 + KILL_WAIT_S  # it waited until its deadline, then no longer than a kill takes
    assert drained.waited == ["polite", "deaf"]  # the running ones, not the one that had exited
    assert drained.killed == ["deaf"] and late == [deaf]
    assert polite.process is not None and polite.process.exitcode == -signal.SIGTERM
    assert deaf.process is not None and deaf.process.exitcode == -signal.SIGKILL
    assert sorted(exited) == sorted(c.process.pid for c in (polite, deaf, done) if c.process is not None)


def test_a_drain_of_children_that_stop_at_once_does_not_wait_for_the_deadline():
    procs, child = _supervisor(), Supervised()
    procs.start(child, _sleep, (60,), "sleeper")
    started = time.monotonic()
    drained = procs.drain([child], timeout_s=30.0)
    assert time.monotonic() - started < 10 and drained.waited == ["sleeper"] and drained.killed == []
    assert procs.drain([child], timeout_s=30.0).waited == []  # nothing left running
