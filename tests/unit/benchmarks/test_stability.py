"""The interleaved measurement's bookkeeping: slices alternate, every counted item lands in one state, and
with nothing switched on the two states agree."""

from __future__ import annotations

import time

import pytest

from benchmarks.stability import interleaved


def _burn(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def _work():
    while True:
        _burn(0.01)
        yield 1


def test_slices_alternate_and_end_quiet():
    states: list[bool] = []
    cpu, wall = interleaved(_work(), int, states.append, slice_s=0.05, total_s=0.6)
    assert states[0] is True and states[-1] is False  # the first switch starts the loops, the last stops them
    assert all(a != b for a, b in zip(states[:-2], states[1:-1], strict=True))  # on, off, on, ... then off
    assert len(states) >= 8
    assert 0.7 < cpu < 1.3 and 0.5 < wall < 2.0  # nothing was switched on: the same work in both states


def test_a_busy_state_that_costs_more_cpu_per_item_shows_in_the_ratio():
    busy = [False]

    def work():
        while True:
            _burn(0.02 if busy[0] else 0.01)
            yield 1

    cpu, _ = interleaved(work(), int, lambda on: busy.__setitem__(0, on), slice_s=0.05, total_s=0.8)
    assert 0.35 < cpu < 0.7  # half the items per CPU-second


def test_slices_too_long_to_reach_the_busy_state_are_refused():
    with pytest.raises(ValueError, match="no work counted in one state"):
        interleaved(_work(), int, lambda on: None, slice_s=10.0, total_s=0.2)


def test_busy_loops_die_with_a_measurement_killed_before_its_finally(tmp_path):
    """A pytest killed mid-measurement never runs busy_loops' `finally`: the loops must not outlive it (two once
    spun on a core for 50 minutes under every measurement that came after)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers import wait_for

    pids = tmp_path / "pids"
    script = ("import sys, time\nsys.path.insert(0, sys.argv[2])\nfrom benchmarks.stability import busy_loops\n"
              "with busy_loops(2, cores=[0]):\n    open(sys.argv[1], 'w').write('spinning')\n    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script, str(pids), os.getcwd()])
    try:
        assert wait_for(lambda: pids.exists(), timeout=30)
        loops = [int(line.split()[0]) for line in subprocess.run(
            ["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.splitlines()]
        assert len(loops) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split()[2] == "Z"  # a zombie no one reaped spins no more
        except FileNotFoundError:
            return True

    assert wait_for(lambda: all(gone(pid) for pid in loops), timeout=10)
