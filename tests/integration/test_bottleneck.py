"""`stoker status` names the stage that bounds a running job: real workers, a real consumer, its /metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from accel.accelerators import SimulatedAccelerator
from stoker.lab import cluster
from stoker.lab.system import can_use_namespaces
from tests.helpers import consumer_for, wait_for


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
