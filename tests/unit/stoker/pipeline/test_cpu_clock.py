"""stoker/pipeline/cpu_clock.py: a batch's cost in CPU time, and the wait for a core, measured or said not to be."""

from __future__ import annotations

import os
import threading
import time

import pytest

from stoker.pipeline.cpu_clock import CpuAccount, run_delay_s, throttled_periods


def _spin(seconds: float) -> None:
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def test_a_batch_costs_the_cpu_of_every_thread_of_its_process_not_the_clock():
    account = CpuAccount()
    time.sleep(0.3)  # waiting costs no CPU
    helper = threading.Thread(target=_spin, args=(0.2,))  # a transform's own thread is part of the cost
    helper.start()
    helper.join(10)
    cost = account.take()
    assert 0.18 < cost.cpu_s < 0.28
    assert account.take().cpu_s < 0.05  # each take() covers only what came after the one before


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux schedstat")
def test_the_wait_for_a_core_is_the_kernels_run_delay_of_the_thread_that_makes_batches():
    delay = run_delay_s()
    assert delay is not None and delay >= 0.0
    assert run_delay_s() >= delay  # it only grows


def test_a_host_without_schedstat_says_not_measured_never_zero(tmp_path):
    empty = tmp_path / "schedstat"
    empty.write_text("")  # a kernel that gives the file but not the field
    assert run_delay_s(empty) is None
    assert run_delay_s(tmp_path / "absent") is None
    assert throttled_periods(None) is None


def test_throttling_is_read_from_the_cgroups_cpu_stat(tmp_path):
    stat = tmp_path / "cpu.stat"
    stat.write_text("nr_periods 31\nnr_throttled 29\nthrottled_time 1435720761\n")
    assert throttled_periods(stat) == 29
    stat.write_text("usage_usec 10\n")
    assert throttled_periods(stat) is None


def test_a_kernel_file_is_read_again_from_its_start_and_a_missing_one_says_none(tmp_path):
    from stoker.pipeline.cpu_clock import _KernelFile

    stat = tmp_path / "cpu.stat"
    stat.write_text("nr_periods 10\nnr_throttled 3\n")
    kept = _KernelFile(stat)
    assert kept.read() == b"nr_periods 10\nnr_throttled 3\n"
    stat.write_text("nr_periods 11\nnr_throttled 4\n")  # the same file, rewritten in place
    assert kept.read() == b"nr_periods 11\nnr_throttled 4\n"
    kept.close()
    assert kept.read() is None
    assert _KernelFile(tmp_path / "absent").read() is None
    assert _KernelFile(None).read() is None
