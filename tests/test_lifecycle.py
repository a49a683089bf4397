"""Daemons and their processes across restarts and deaths: rejoining a job, dying with a parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from accel import checkpoint
from accel.accelerators import SimulatedAccelerator
from accel.consumer import Consumer, ConsumerConfig
from accel.job import JobConfig
from tests.helpers import Daemon, free_port, wait_for


class Crash(Exception):
    pass


def test_a_consumer_restarted_after_the_daemons_left_gets_them_back(manifest, log_dir, tmp_path):
    """The daemons leave the job after 2 s of silence; the consumer comes back 6 s after it died,
    from its checkpoint, and they rejoin the same job: the epoch completes exactly once."""
    cfg = ConsumerConfig(data_bind=f"tcp://127.0.0.1:{free_port()}", control_bind=f"tcp://127.0.0.1:{free_port()}",
                         metrics_port=None, host_timeout_s=3.0)
    job = JobConfig(manifest_uri=manifest.uri, epochs=1, batch_size=16, unit_batches=2)
    first = Consumer(cfg, job, SimulatedAccelerator(rate=200))
    first.start()
    daemons = [Daemon(first.control_endpoint, f"host{i}", 1, log_dir, extra=("--leave-after", "2"))
               for i in range(2)]
    stepped_before = []

    def step_then_maybe_die(consumer: Consumer) -> None:
        if consumer.ledger.samples >= 0.4 * manifest.num_samples:
            checkpoint.save(consumer.state_dict(), tmp_path / "data.json")
            stepped_before.append(consumer.ledger.delivered(0))
            raise Crash

    try:
        with pytest.raises(Crash):
            first.run(on_step=step_then_maybe_die)
    finally:
        first.stop()
    died = time.monotonic()
    assert wait_for(lambda: all("leaving job" in d.output() for d in daemons), timeout=30), daemons[0].output()
    time.sleep(max(0.0, 6.0 - (time.monotonic() - died)))
    state = checkpoint.load(tmp_path / "data.json")
    second = Consumer(cfg, job, SimulatedAccelerator(rate=200), resume=state)
    try:
        summary = second.run()
        codes = [d.wait(timeout=30) for d in daemons]
    finally:
        second.stop()
        for d in daemons:
            d.stop()
    assert codes == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
    after = second.ledger.delivered(0)
    assert not (stepped_before[0] & after).any() and (stepped_before[0] | after).all()
    assert summary.samples == manifest.num_samples - state["samples_stepped"]
    assert all(d.output().count(f"joined job {first.job.job_id}") == 2 for d in daemons)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    return False
        except FileNotFoundError:
            continue
    return True


def test_decode_processes_die_with_their_daemon(manifest, log_dir):
    consumer = Consumer(ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0",
                                       metrics_port=None),
                        JobConfig(manifest_uri=manifest.uri, epochs=50, batch_size=16), SimulatedAccelerator(rate=50))
    consumer.start()
    daemon = Daemon(consumer.control_endpoint, "h0", 2, log_dir)
    try:
        assert wait_for(lambda: len(daemon.children()) == 2, timeout=30), daemon.output()
        children = daemon.children()
        daemon.proc.send_signal(signal.SIGKILL)  # only the daemon: no chance to drain
        daemon.proc.wait(10)
        assert wait_for(lambda: _gone(children), timeout=10), f"decode processes {children} outlived their daemon"
    finally:
        daemon.stop()
        consumer.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_worker_daemons_die_with_their_stoker_run(manifest, tmp_path):
    """kill -9 `stoker run`: its daemons and their processes go too, and free their metrics ports."""
    port = free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.Popen([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--epochs", "50",
                            "--accel", "simulated", "--rate", "50", "--no-progress", "--metrics-port", "-1",
                            "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                            "--worker-metrics-port", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: not _port_free(port) and not _port_free(port + 1), timeout=60)
        daemons = _children(run.pid)
        family = daemons + [c for d in daemons for c in _children(d)]
        assert len(family) >= 4  # two daemons, each with a decode process (and a resource tracker)
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert wait_for(lambda: _gone(family), timeout=10), "daemons outlived stoker run"
        assert _port_free(port) and _port_free(port + 1)
        assert not list(tmp_path.glob("stoker-worker-metrics-*"))  # each daemon removed its metrics folder
    finally:
        if run.poll() is None:
            run.kill()


def test_once_daemons_leave_as_soon_as_stoker_train_finishes(manifest, log_dir, tmp_path):
    control = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    train = subprocess.Popen([sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--batch-size", "16",
                              "--no-progress", "--metrics-port", "-1", "--data-bind", "tcp://127.0.0.1:0",
                              "--control-bind", control], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    daemon = Daemon(control, "h0", 1, log_dir, env=env)
    try:
        assert train.wait(120) == 0
        ended = time.monotonic()
        assert daemon.wait(timeout=30) == 0, daemon.output()
        assert time.monotonic() - ended < 5, "the daemon did not hear that the job finished"
        assert not list(tmp_path.glob("stoker-worker-metrics-*"))
    finally:
        daemon.stop()
        if train.poll() is None:
            train.kill()
