"""accel/bottleneck.py: which stage bounds a job, from one window of counters."""

from __future__ import annotations

import pytest

from accel.bottleneck import Totals, diagnose


def _window(stall_s=0.0, step_s=9.0, decode=2.0, augment=0.5, wait=0.0, transit=0.01, queue=0, batches=100,
            rows=6400, cpu_wait=0.0, throttled=0.0, read_wait=0.0, measured=True,
            min_transit=float("inf")) -> tuple[Totals, Totals]:
    """Ten seconds of a job: counters at the start (all zero) and at the end."""
    end = Totals(at=10.0, stall_s=stall_s, step_s=step_s, rows=rows, batches=batches, received_batches=batches,
                 transit_s=transit * batches, wait_for_credit_s=wait, work_s={"decode": decode, "augment": augment},
                 queue_depth=queue, cpu_s=decode + augment, cpu_wait_s=cpu_wait, throttled_wait_s=throttled,
                 cpu_wait_batches=batches if measured else 0, read_wait_s=read_wait, min_transit_s=min_transit)
    return Totals(at=0.0, work_s={"decode": 0.0, "augment": 0.0}, queue_depth=queue), end


def test_a_device_that_never_waits_is_the_bottleneck():
    d = diagnose(*_window(stall_s=0.2, step_s=9.7, wait=8.0))
    assert d.stage == "compute" and d.stall_fraction == pytest.approx(0.02)


def test_busy_workers_and_a_waiting_device_name_the_larger_worker_stage():
    # 6,400 rows in 2 s of device time: it wants 3,200 rows/s; workers made them in 25 busy seconds
    # (256 rows per busy second), so 12.5 busy workers would feed it; 2.5 are busy now.
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, wait=0.5))
    assert d.stage == "decode"
    assert d.cores_in_use == pytest.approx(2.5) and d.cores_needed == pytest.approx(12.5)
    assert diagnose(*_window(stall_s=8.0, step_s=2.0, decode=5.0, augment=20.0, wait=0.5)).stage == "augment"


def test_idle_workers_tell_a_full_link_from_slow_credit_by_transit_time():
    # 100 batches in 10 s: a 0.1 s device cycle. 0.3 s in transit: the link is full.
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3)).stage == "wire"
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.002)).stage == "credit"


def test_a_long_transit_that_does_not_queue_is_the_links_latency_and_credit_must_cover_it():
    # every batch takes 0.3 s, none longer than the quickest: latency (a far link), not a full one
    latency = diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3, min_transit=0.29))
    assert latency.stage == "credit" and "--credit-window" in latency.detail
    # the quickest took 0.05 s and the rest queue behind each other for 0.25 s more: the link is full
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3, min_transit=0.05)).stage == "wire"


def test_batches_queued_on_a_waiting_device_point_at_its_own_conversion():
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, queue=3)).stage == "device_copy"


def test_too_few_samples_to_judge_say_so():
    assert diagnose(*_window(batches=1)).stage == "unknown"


def test_workers_that_wait_for_a_core_are_starved_not_short_of_credit_or_cores():
    # busy 10 s and runnable-but-waiting 10 s: half their runnable time went to other processes
    d = diagnose(*_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=2.0, wait=0.2, cpu_wait=10.0))
    assert d.stage == "contention" and d.cpu_wait_fraction == pytest.approx(0.5)
    assert "waited 50% of their time for a core" in d.detail and "credit" not in d.detail
    quota = diagnose(*_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=2.0, cpu_wait=10.0, throttled=9.0))
    assert quota.stage == "throttled" and "quota" in quota.detail


def test_a_little_waiting_for_a_core_leaves_the_busy_workers_short_of_cores():
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, wait=0.5, cpu_wait=2.0))
    assert d.stage == "decode" and "short of cores" in d.detail


def test_workers_waiting_for_reads_name_storage():
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, decode=3.0, augment=1.0, read_wait=6.0)).stage == "storage"


def test_a_slow_store_beside_busy_neighbours_is_storage_while_the_reads_wait_the_longer():
    # busy 1 s, waiting for a core 1 s (half their runnable time), waiting on reads 8 s: a core of their own
    # would win back a tenth of their time, a faster store most of it
    mixed = diagnose(*_window(stall_s=9.0, step_s=1.0, decode=0.8, augment=0.2, cpu_wait=1.0, read_wait=8.0))
    assert mixed.stage == "storage" and mixed.cpu_wait_fraction == pytest.approx(0.5)
    # the same wait for a core with reads that wait less than it: contention
    assert diagnose(*_window(stall_s=9.0, step_s=1.0, decode=0.8, augment=0.2, cpu_wait=5.0,
                             read_wait=4.0)).stage == "contention"


def test_a_wait_for_a_core_that_was_not_measured_is_said_so_not_taken_as_none():
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, measured=False))
    assert d.cpu_wait_fraction is None and "not measured" in d.detail
    assert diagnose(*_window(stall_s=0.1, measured=False)).detail == "the device waits 1.0% of the time"


def test_a_wait_that_began_before_the_window_never_makes_the_stall_exceed_the_window():
    assert diagnose(*_window(stall_s=10.05, step_s=0.0, decode=20.0, augment=5.0)).stall_fraction == 1.0
