"""Live bottleneck diagnosis: the rules on hand-made counters, and `stoker status` against real jobs
made slow on purpose in each place."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from accel.accelerators import SimulatedAccelerator
from accel.bottleneck import Totals, diagnose
from stoker.lab import cluster
from stoker.lab.system import can_use_namespaces
from tests.helpers import consumer_for, wait_for


def _window(stall_s=0.0, step_s=9.0, decode=2.0, augment=0.5, wait=0.0, transit=0.01, queue=0, batches=100,
            rows=6400) -> tuple[Totals, Totals]:
    """Ten seconds of a job: counters at the start (all zero) and at the end."""
    end = Totals(at=10.0, stall_s=stall_s, step_s=step_s, rows=rows, batches=batches, received_batches=batches,
                 transit_s=transit * batches, wait_for_credit_s=wait, work_s={"decode": decode, "augment": augment},
                 queue_depth=queue)
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


def test_batches_queued_on_a_waiting_device_point_at_its_own_conversion():
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, queue=3)).stage == "device_copy"


def test_too_few_samples_to_judge_say_so():
    assert diagnose(*_window(batches=1)).stage == "unknown"


def _status(metrics_url: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "stoker", "status", "--json", "--metrics", metrics_url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _settled_status(metrics_url: str, running, timeout: float = 60.0) -> dict:
    """The diagnosis once two readings a second apart agree on a stage other than unknown."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline and running():
        status = _status(metrics_url)
        if status["stage"] != "unknown" and last is not None and last["stage"] == status["stage"]:
            return status
        last = status
        time.sleep(1.0)
    raise AssertionError(f"no settled diagnosis; last: {last}")


def test_status_names_decode_when_one_worker_core_feeds_a_fast_device(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=100, accel=SimulatedAccelerator(20_000), image_size=224)
    job = run_job(consumer, hosts=1)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    time.sleep(6)  # a full window of steady running
    status = _settled_status(url, job.thread.is_alive)
    print(status["text"])
    assert status["stage"] == "decode", status["text"]
    assert status["stall_fraction"] > 0.5
    assert status["cores_needed"] > 2 * status["cores_in_use"] > 0  # the device wants many more workers
    assert "bottleneck: decode" in subprocess.run([sys.executable, "-m", "stoker", "status", "--metrics", url],
                                                  capture_output=True, text=True, timeout=30).stdout


def test_status_names_compute_when_the_device_is_slow(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=6, accel=SimulatedAccelerator(120), image_size=112)
    job = run_job(consumer, hosts=2)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    time.sleep(6)
    status = _settled_status(url, job.thread.is_alive)
    assert status["stage"] == "compute", status["text"]
    assert status["stall_fraction"] < 0.05
    assert status["cores_needed"] < status["cores_in_use"] + 1


def test_status_watch_shows_the_rate_and_each_host_while_the_job_runs(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=8, accel=SimulatedAccelerator(200), image_size=64)
    job = run_job(consumer, hosts=2)
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60), job.logs()
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    out = subprocess.run([sys.executable, "-m", "stoker", "status", "--watch", "--interval", "1", "--count", "3",
                          "--metrics", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    frames = [f for f in out.stdout.split("\n\n") if f.strip()]
    assert len(frames) == 3  # not a terminal: frames one after another, no screen clearing
    last = frames[-1].splitlines()
    rate = float(last[1].split()[1].replace(",", ""))
    assert 100 < rate < 300, frames[-1]  # the device takes 200 rows/s
    hosts = {line.split()[0]: float(line.split()[1].replace(",", "")) for line in last[3:]}
    assert set(hosts) == {"host0", "host1"} and sum(hosts.values()) > 0, frames[-1]
    job.finish()


@pytest.mark.skipif(can_use_namespaces() is not None, reason=f"needs network namespaces: {can_use_namespaces()}")
def test_status_names_the_wire_when_a_host_link_is_throttled(manifest, tmp_path, monkeypatch):
    """16 images of 224 px are 2.4 MB a batch; at 20 Mbit/s the link carries about one a second."""
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    cluster.down()
    try:
        state = cluster.Lab(cluster.LabConfig(hosts=1, cores_per_host=1.0, link_gbit=0.02)).up(
            ["--data", manifest.uri, "--batch-size", "16", "--epochs", "20", "--accel", "simulated",
             "--rate", "2000"])
        time.sleep(8)
        status = _settled_status(state.consumer.metrics, lambda: cluster.alive(state.consumer.pid), timeout=90)
        print(status["text"])
        assert status["stage"] == "wire", status["text"]
        assert status["stall_fraction"] > 0.5
    finally:
        cluster.down()
