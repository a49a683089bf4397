"""benchmarks/report.py: a figure measured on a shared core says so."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.report import CoreWatch, header


def _spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


@pytest.fixture
def pinned_core():
    core = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    yield core
    os.sched_setaffinity(0, before)


def test_core_watch_sees_a_neighbour_on_the_pinned_core(pinned_core, capsys):
    spin = f"import os; os.sched_setaffinity(0, {{{pinned_core}}}); print('pinned', flush=True)\nwhile True: pass"
    neighbour = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout.readline() == "pinned\n"  # it spins on our core from here on
        with CoreWatch(pinned_core) as shared:
            _spin(1.0)
    finally:
        neighbour.kill()
        neighbour.wait()
        neighbour.stdout.close()
    # The neighbour takes about half the core (less when strays of a busy machine take some too, and
    # they count as others as well); our own time is never counted as theirs: the two fill one core.
    assert shared.others_share > 0.3
    assert shared.own_share + shared.others_share < 1.1  # a tick's rounding either side
    assert "was shared while measured" in capsys.readouterr().out


def test_core_watch_counts_only_others(pinned_core):
    with CoreWatch(pinned_core) as alone:
        _spin(0.5)
    # Our own spinning is not a neighbour: counted as one, own + others would be twice what we ran.
    # (Strays of a busy machine may take some of the core; they still leave the sum within the core.)
    assert alone.own_share > 0.3
    assert alone.own_share + alone.others_share < 1.1


def test_header_names_the_cpu_and_versions():
    found = header("x", "pillow-simd")
    assert found["benchmark"] == "x" and "family" in found["cpu"]
    assert found["reference_loops_per_s"] > 0 and found["versions"]["pillow-simd"]
