"""stoker/workers/decode_child.py: a decode process stopped (SIGSTOP) past STOPPED_KILL_S is killed, one that
runs is left alone, and an exit is named as the log says it."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from stoker.workers import decode_child
from stoker.workers.decode_child import DecodeChild, exit_name, kill_if_frozen, stopped
from tests.helpers import wait_for


def test_exits_are_named_by_code_or_signal():
    assert exit_name(3) == "exit code 3" and exit_name(None) == "exit code None"
    assert exit_name(-signal.SIGSEGV) == "SIGSEGV" and exit_name(-200) == "signal 200"


def test_a_stopped_process_is_killed_past_its_grace_and_a_running_one_is_not(monkeypatch):
    monkeypatch.setattr(decode_child, "STOPPED_KILL_S", 0.2)
    child = DecodeChild(0)
    child.process = mp.get_context("spawn").Process(target=time.sleep, args=(60,), name="host0/p0.1")
    child.process.start()
    try:
        assert child.watched() and child.process.pid is not None
        kill_if_frozen(child, "host0", "host0/p0.1")
        assert child.stopped_since is None and child.process.is_alive()  # running: left alone
        os.kill(child.process.pid, signal.SIGSTOP)
        assert wait_for(lambda: stopped(child.process.pid), timeout=10)
        kill_if_frozen(child, "host0", "host0/p0.1")
        assert child.stopped_since is not None and child.process.is_alive()  # seen stopped: its grace begins
        time.sleep(0.3)
        kill_if_frozen(child, "host0", "host0/p0.1")
        child.process.join(10)
        assert child.process.exitcode == -signal.SIGKILL and child.stopped_since is None
    finally:
        child.process.kill()
        child.process.join(10)
    assert not stopped(child.process.pid)  # gone: it cannot be read


def test_a_finished_or_restarting_child_is_not_watched():
    child = DecodeChild(1, incarnation=4)
    assert not child.watched() and child.incarnation == 4  # never started
    child.process = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
    child.restart_at = 1.0
    assert not child.watched()
    child.restart_at, child.finished = None, True
    assert not child.watched()
