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
    assert 0.3 < shared.others_share < 0.7  # the scheduler splits one core between two spinners
    assert "was shared while measured" in capsys.readouterr().out


def test_core_watch_counts_only_others(pinned_core):
    with CoreWatch(pinned_core) as alone:
        _spin(0.5)
    assert alone.others_share < 0.2  # our own spinning is not a neighbour


def test_header_names_the_cpu_and_versions():
    found = header("x", "pillow-simd")
    assert found["benchmark"] == "x" and "family" in found["cpu"]
    assert found["reference_loops_per_s"] > 0 and found["versions"]["pillow-simd"]
