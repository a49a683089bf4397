"""What the benchmarks share: one pinned `stoker worker` daemon feeding a consumer in this process, and free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from stoker.accel.consumer import Consumer
from stoker.accel.summary import Summary


def run_with_worker(consumer: Consumer, worker_cores: str, procs: int = 1) -> Summary:
    """Start the consumer, a worker daemon pinned to `worker_cores`, run the job, stop both."""
    consumer.start()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    worker = subprocess.Popen(["taskset", "-c", worker_cores, sys.executable, "-m", "stoker", "worker", "--connect",
                               consumer.control_endpoint, "--procs", str(procs), "--host-id", "bench", "--once",
                               "--no-metrics"], env=env)
    try:
        return consumer.run(procs_per_host=procs)
    finally:
        worker.wait(60)
        consumer.stop()


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
