"""`stoker status` names the stage that bounds a running job: real workers, a real consumer, its /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.stability import busy_loops
from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.bottleneck import WINDOW_S
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.lab import cluster
from stoker.lab.system import can_use_namespaces
from stoker.pipeline.job import JobConfig
from tests.helpers import DelayProxy, consumer_for, scrape_url, wait_for

QUIET_S = 1.0
BUSY_CORES = 0.5  # other processes using more than half a core: the workers will wait for one


def _busy_cores(seconds: float = QUIET_S) -> float:
    """Cores in use on the whole machine over `seconds` (this test, idle meanwhile, uses none)."""
    def ticks() -> tuple[int, int]:
        fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    all_before, idle_before = ticks()
    time.sleep(seconds)
    all_after, idle_after = ticks()
    busy = (all_after - all_before) - (idle_after - idle_before)
    return busy / (all_after - all_before) * (os.cpu_count() or 1) if all_after > all_before else 0.0


@pytest.fixture
def quiet_host() -> None:
    """A verdict other than contention presumes the workers get the cores they ask for: on a machine
    other work keeps busy, `stoker status` rightly says contention (the test beside it checks that),
    so these tests say why they cannot run there instead of failing for being right."""
    busy = _busy_cores()
    if busy > BUSY_CORES:
        pytest.skip(f"the machine is busy ({busy:.1f} cores in use by other processes): this verdict presumes "
                    "the workers get the cores they ask for")


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


def _steady_window(consumer, job) -> None:
    """Wait until the bottleneck monitor's window holds a full WINDOW_S of running and no start-up: its
    oldest reading was taken after the first samples were stepped."""
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60), job.logs()
    running = time.monotonic()
    history = consumer.bottleneck.history  # readings, one a second, from a thread: index, never iterate
    assert wait_for(lambda: len(history) > 1 and history[0].at >= running
                    and history[-1].at - history[0].at >= consumer.bottleneck.window_s, timeout=60), job.logs()


@pytest.mark.usefixtures("quiet_host")
def test_status_names_decode_when_one_worker_core_feeds_a_fast_device(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=100, accel=SimulatedAccelerator(20_000), image_size=224)
    job = run_job(consumer, hosts=1)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    _steady_window(consumer, job)
    status = _settled_status(url, job.thread.is_alive)
    print(status["text"])
    assert status["stage"] == "decode", status["text"]
    assert status["failure"] == "" and "failed" not in status["text"]  # a healthy job has no failure sample
    # whose endpoint it read: a bare `stoker status` may reach another job's 9560, and says whose it is
    job = status["job"]
    assert job["job_id"] == consumer.job.job_id and job["rank"] == "0" and job["pid"] == str(os.getpid())
    assert status["text"].splitlines()[0].startswith(f"job {consumer.job.job_id} (imagenet), rank 0, process ")
    assert status["stall_fraction"] > 0.5
    assert status["cores_needed"] > 2 * status["cores_in_use"] > 0  # the device wants many more workers
    assert "bottleneck: decode" in subprocess.run([sys.executable, "-m", "stoker", "status", "--metrics", url],
                                                  capture_output=True, text=True, timeout=30).stdout


def test_status_names_contention_when_other_processes_take_the_workers_cores(manifest, run_job):
    """The job of the test above, beside a busy loop per core: the same worker is now starved of CPU,
    which is no reason to raise the credit window or to count it as the transform's cost."""
    consumer = consumer_for(manifest.uri, epochs=100, accel=SimulatedAccelerator(20_000), image_size=224)
    job = run_job(consumer, hosts=1)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    with busy_loops(os.cpu_count() or 2):
        _steady_window(consumer, job)  # a whole window beside the loops
        status = _settled_status(url, job.thread.is_alive)
    print(status["text"])
    assert status["stage"] == "contention", status["text"]
    assert status["cpu_wait_fraction"] > 0.2 and "for a core" in status["text"]
    assert "--credit-window" not in status["text"]


@pytest.mark.usefixtures("quiet_host")
@pytest.mark.parametrize("hosts", [1, 2])
def test_status_names_the_workers_short_of_cores_when_more_processes_than_cores_wait_for_each_other(
        manifest, run_job, hosts):
    """Twice as many worker processes as cores on a quiet machine, on one host or on two emulated hosts
    of it: they wait for a core half their time, but for each other, not for neighbours; more processes
    would not help, more cores would."""
    cores = len(os.sched_getaffinity(0))
    consumer = consumer_for(manifest.uri, epochs=400, accel=SimulatedAccelerator(20_000), image_size=224)
    job = run_job(consumer, hosts=hosts, procs=2 * cores // hosts)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    _steady_window(consumer, job)
    status = _settled_status(url, job.thread.is_alive)
    print(status["text"])
    assert status["stage"] in ("decode", "augment"), status["text"]
    assert status["cpu_wait_fraction"] > 0.2  # they did wait for a core, and it is not called contention
    detail = consumer.bottleneck.latest.detail
    where = "host0" if hosts == 1 else "one machine (hosts host0, host1)"
    assert f"{2 * cores} processes on {cores:g} cores of {where}" in detail and "not processes" in detail, detail


def test_status_names_compute_when_the_device_is_slow(manifest, run_job):
    # 14 epochs of 160 rows at 120 rows/s: ~19 s, room for start-up, a full window and two readings
    consumer = consumer_for(manifest.uri, epochs=14, accel=SimulatedAccelerator(120), image_size=112)
    job = run_job(consumer, hosts=2)
    url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
    _steady_window(consumer, job)
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


@pytest.mark.usefixtures("quiet_host")
@pytest.mark.needs_namespaces
@pytest.mark.skipif(can_use_namespaces() is not None, reason=f"needs network namespaces: {can_use_namespaces()}")
def test_status_names_the_wire_when_a_host_link_is_throttled(manifest, tmp_path, monkeypatch):
    """16 images of 224 px are 2.4 MB a batch; at 20 Mbit/s the link carries about one a second."""
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    cluster.down()
    try:
        state = cluster.Lab(cluster.LabConfig(hosts=1, cores_per_host=1.0, link_gbit=0.02)).up(
            ["--data", manifest.uri, "--batch-size", "16", "--epochs", "20", "--accel", "simulated",
             "--rate", "2000"])
        # the consumer runs in the lab: wait for its first samples, then let one window of running pass
        assert wait_for(lambda: scrape_url(state.consumer.metrics).get("stoker_consumer_samples_total", 0) > 0,
                        timeout=60)
        time.sleep(WINDOW_S)  # the diagnosis looks back WINDOW_S: the time passing is what it measures
        status = _settled_status(state.consumer.metrics, lambda: cluster.alive(state.consumer.pid), timeout=90)
        print(status["text"])
        assert status["stage"] == "wire", status["text"]
        assert status["stall_fraction"] > 0.5
    finally:
        cluster.down()


@pytest.mark.usefixtures("quiet_host")
def test_status_names_credit_when_a_far_link_outlasts_a_small_credit_window(manifest, run_job):
    """100 ms each way on the data link and two batches of credit per process: the link is idle most of the
    time, batches never queue on it, and only a larger window helps. A batch spends half the device cycle
    this leaves in transit, which the rule before took for a full link. (The delay is a user-space relay on
    127.0.0.2, the address the consumer advertises: this kernel has no sch_netem for `tc netem`.)"""
    far = "127.0.0.2"
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0,
                         advertise_host=far, credit_window=2)
    job_cfg = JobConfig(manifest_uri=manifest.uri, epochs=100, batch_size=16, unit_batches=2, image_size=64)
    consumer = Consumer(cfg, job_cfg, given(SimulatedAccelerator(2_000)))
    job = run_job(consumer, hosts=1, start_workers=False)
    assert wait_for(lambda: consumer.data_endpoint != "", timeout=30)
    data_port = int(consumer.data_endpoint.rsplit(":", 1)[1])
    control_port = int(consumer.control_endpoint.rsplit(":", 1)[1])
    proxy = DelayProxy({(far, data_port): (("127.0.0.1", data_port), 0.1),
                        (far, control_port): (("127.0.0.1", control_port), 0.0)})
    try:
        job.start_workers()
        url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
        _steady_window(consumer, job)
        status = _settled_status(url, job.thread.is_alive)
    finally:
        job.close()
        proxy.close()
    print(status["text"])
    assert status["stage"] == "credit", status["text"]
    assert status["stall_fraction"] > 0.5 and "--credit-window" in status["text"]


@pytest.mark.needs_namespaces
@pytest.mark.skipif(can_use_namespaces() is not None, reason=f"needs network namespaces: {can_use_namespaces()}")
def test_status_names_the_quota_when_a_cgroup_throttles_the_workers(manifest, tmp_path, monkeypatch):
    """A worker host in the lab with a quarter of a core (a cgroup CPU quota) feeding a fast device."""
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    cluster.down()
    try:
        state = cluster.Lab(cluster.LabConfig(hosts=1, cores_per_host=0.25)).up(
            ["--data", manifest.uri, "--batch-size", "16", "--epochs", "20", "--accel", "simulated", "--rate", "2000"])
        assert wait_for(lambda: scrape_url(state.consumer.metrics).get("stoker_consumer_samples_total", 0) > 0,
                        timeout=60)
        time.sleep(WINDOW_S)
        status = _settled_status(state.consumer.metrics, lambda: cluster.alive(state.consumer.pid), timeout=90)
        print(status["text"])
        assert status["stage"] == "throttled", status["text"]
        assert status["cpu_wait_fraction"] > 0.5 and "quota" in status["text"]
        assert 0.15 < status["cores_in_use"] < 0.3  # a quarter of a core, in CPU time
    finally:
        cluster.down()
