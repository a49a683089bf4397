"""The dispatcher as its own process: killed mid-epoch and restarted from its journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from accel.accelerators import SimulatedAccelerator
from accel.consumer import Consumer, ConsumerConfig
from accel.journal import replay
from tests.helpers import Daemon, assert_exactly_once, free_port, wait_for


def _dispatcher(manifest_uri: str, control: str, data: str, journal, log_path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "dispatch", "--data", manifest_uri,
           "--consumer", data, "--journal", str(journal), "--control-bind", control, "--metrics-port", "-1",
           "--host-timeout", "3", "--epochs", "2", "--batch-size", "16", "--unit-batches", "2"]
    return subprocess.Popen(cmd, stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"})


def test_a_dispatcher_restarted_from_its_journal_finishes_the_epoch(manifest, log_dir):
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal = log_dir / "dispatch.journal"
    first = _dispatcher(manifest.uri, control, data, journal, log_dir / "dispatch.log")
    consumer = Consumer(ConsumerConfig(data_bind=data, dispatcher=control, metrics_port=None), None,
                        SimulatedAccelerator(rate=250))
    consumer.start()
    daemons = [Daemon(control, f"host{i}", 1, log_dir) for i in range(2)]
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(summary=consumer.run()), daemon=True)
    runner.start()
    second = None
    try:
        assert wait_for(lambda: consumer.ledger.samples > 0.3 * 2 * manifest.num_samples, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        done_before = len(replay(journal).done)
        assert done_before > 0
        second = _dispatcher(manifest.uri, control, data, journal, log_dir / "dispatch.log")
        runner.join(120)
        assert not runner.is_alive(), (log_dir / "dispatch.log").read_text()[-3000:]
        codes = [d.wait(timeout=60) for d in daemons]
        assert codes == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
        assert second.wait(30) == 0
    finally:
        consumer.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    summary = result["summary"]
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert consumer.ledger.collisions == 0 and summary.duplicates_dropped >= 0
    log = (log_dir / "dispatch.log").read_text()
    assert "continuing from" in log and f"{done_before} units done" in log
