"""Process and metrics helpers for the integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """Every sample of a /metrics page, keyed by name{labels}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


class Daemon:
    """A real `stoker worker` process."""

    def __init__(self, connect: str, host_id: str, procs: int, log_dir: Path, once: bool = True) -> None:
        self.metrics_port = free_port()
        self.log_path = log_dir / f"{host_id}.log"
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", "--connect", connect,
               "--procs", str(procs), "--host-id", host_id, "--metrics-port", str(self.metrics_port)]
        if once:
            cmd.append("--once")
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        pids = [int(p) for p in out.split()]
        # multiprocessing's spawn start also runs a resource tracker; decode processes run process_main
        return [p for p in pids if b"multiprocessing.spawn" in Path(f"/proc/{p}/cmdline").read_bytes()
                and b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def wait(self, timeout: float) -> int | None:
        """The exit code once the daemon has exited by itself, None if it is still running."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
