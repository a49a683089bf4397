"""Process, job and metrics helpers for the integration tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.accel.summary import Summary
from stoker.pipeline.job import JobConfig

TEST_PORTS = range(20000, 32000)  # below Linux's ephemeral range (32768-60999 by default)


def free_port() -> int:
    """A free loopback port outside the ephemeral range. A port from that range (what binding port 0
    gives) can meanwhile become the source port of some process's outgoing connection, or a client
    that connects to it before its server binds can connect to itself (TCP self-connect): the
    client then talks to itself and never hears the server."""
    for _ in range(200):
        port = random.choice(TEST_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free loopback port in {TEST_PORTS}")


def scrape(port: int) -> dict[str, float]:
    """Every sample of a loopback /metrics page, keyed by name{labels}."""
    return scrape_url(f"http://127.0.0.1:{port}/metrics")


def scrape_url(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed by name{labels}."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


class Daemon:
    """A real `stoker worker` process. Every one started is stopped after its test, also when the
    test fails before it could (tests/conftest.py), so none is left to load the next tests."""

    started: list[Daemon] = []

    def __init__(self, connect: str, host_id: str, procs: int, log_dir: Path, once: bool = True,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None, fleet: bool = False) -> None:
        """`fleet`: `connect` is a fleet's endpoint (stoker worker --fleet; never --once)."""
        self.host_id = host_id
        self.metrics_port = free_port()
        self.log_path = log_dir / f"{host_id}.log"
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", "--fleet" if fleet else "--dispatcher",
               connect, "--procs", str(procs), "--host-id", host_id, "--metrics-port", str(self.metrics_port)]
        if once and not fleet:
            cmd.append("--once")
        cmd += extra
        env = {k: v for k, v in (env or os.environ).items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        Daemon.started.append(self)

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

    def unanswered(self) -> bool:
        """Since it last left a job (or since it started), it has asked the dispatcher to register for
        protos.control_client.WARN_AFTER_S with no answer, and goes on asking (it logs so once)."""
        since = self.output().rpartition("leaving job")[2]
        return any(f" {self.host_id}/daemon." in line and ": no answer from the dispatcher" in line
                   and line.endswith("still trying") for line in since.splitlines())

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
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False): a wait exactly as long
    as needed. Use it as `assert wait_for(..., timeout=T), "what did not happen"`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def consumer_for(manifest_uri: str, epochs: int = 2, accel=None, overlap: bool = True, **job) -> Consumer:
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0,
                         overlap=overlap)
    job.setdefault("batch_size", 16)
    job.setdefault("unit_batches", 2)
    return Consumer(cfg, JobConfig(manifest_uri=manifest_uri, epochs=epochs, **job), given(accel) if accel else None)


class Job:
    """A consumer running in a thread plus worker daemons in subprocesses."""

    def __init__(self, consumer: Consumer, log_dir, hosts: int = 2, procs: int = 1, start_workers: bool = True):
        self.consumer = consumer
        self.log_dir = log_dir
        self.hosts, self.procs = hosts, procs
        self.daemons: list[Daemon] = []
        self.summary: Summary | None = None
        self.error: BaseException | None = None
        consumer.start()
        if start_workers:
            self.start_workers()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def start_workers(self) -> None:
        for i in range(self.hosts):
            self.daemons.append(Daemon(self.consumer.control_endpoint, f"host{i}", self.procs, self.log_dir))

    def _run(self) -> None:
        try:
            self.summary = self.consumer.run(procs_per_host=self.procs)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self, timeout: float = 120) -> Summary:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job did not finish; worker logs:\n" + self.logs()
        assert self.error is None, self.error
        codes = [d.wait(timeout=30) for d in self.daemons]  # with --once they leave by themselves
        assert codes == [0] * len(codes), self.logs()
        assert self.summary is not None
        return self.summary

    def logs(self) -> str:
        return "\n".join(d.output()[-3000:] for d in self.daemons)

    def close(self) -> None:
        """Stop the daemons and the consumer; the consumer's thread must end with them (a run that went on
        after its stream ended once spun a core for the rest of the test session)."""
        for d in self.daemons:
            d.stop()
        self.consumer.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the consumer's run went on for 30 s after stop()"


def assert_exactly_once(summary: Summary, num_samples: int, epochs: int, skipped_per_epoch: int = 0) -> None:
    expected = epochs * (num_samples - skipped_per_epoch)
    assert summary.samples == summary.unique_samples == expected
    assert summary.per_epoch_unique == [num_samples - skipped_per_epoch] * epochs


class RecordingAccelerator(SimulatedAccelerator):
    """A simulated device that remembers which samples each of its steps trained on."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self.stepped: list[np.ndarray] = []

    def step(self, batch) -> None:
        self.stepped.append(np.asarray(batch.sample_ids).copy())
        super().step(batch)

    def samples(self) -> np.ndarray:
        return np.concatenate(self.stepped) if self.stepped else np.empty(0, dtype=np.int64)


class PixelRecorder(SimulatedAccelerator):
    """A simulated device that keeps what each step trained on: (epoch, sample id) -> (image, label)."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self.trained: dict[tuple[int, int], tuple[np.ndarray, int]] = {}

    def step(self, batch) -> None:
        images, labels = batch.images, batch.labels
        for row, sample_id in enumerate(np.asarray(batch.sample_ids).tolist()):
            self.trained[(int(batch.header.epoch), sample_id)] = (images[row].copy(), int(labels[row]))
        super().step(batch)

    def wrong(self, expected: dict[int, tuple[np.ndarray, int]]) -> list[tuple[int, int]]:
        """(epoch, sample id) of every trained sample whose pixels or label are not `expected`'s (sample id ->
        (image, label), made from valid shards), or that has no expected image at all."""
        bad = []
        for (epoch, sample_id), (image, label) in self.trained.items():
            want = expected.get(sample_id)
            if want is None or want[1] != label or not np.array_equal(want[0], image):
                bad.append((epoch, sample_id))
        return bad


def run_recorded(manifest_uri: str, log_dir: Path, env: dict[str, str] | None = None, procs: int = 1,
                 timeout: float = 60, **job) -> tuple[Job, PixelRecorder, dict[str, float]]:
    """One epoch of tests.shard_edits.JOB (and `job`) with one worker daemon (`env`: its environment); returns
    the finished job, what trained, and the daemon's metrics at the end."""
    from tests.shard_edits import JOB

    recorder = PixelRecorder(rate=5000)
    consumer = consumer_for(manifest_uri, epochs=1, accel=recorder, **(JOB | job))
    runner = Job(consumer, log_dir, hosts=0, procs=procs)
    runner.hosts = 1
    runner.daemons.append(Daemon(consumer.control_endpoint, "host0", procs, log_dir, env=env))
    assert wait_for(lambda: not runner.thread.is_alive(), timeout=timeout), "the job did not finish:\n" + runner.logs()
    metrics = scrape(runner.daemons[0].metrics_port)  # the daemon waits for a drain before exiting
    runner.finish()
    return runner, recorder, metrics


def sample_of(reader, row: int):
    """Row `row` of a shard as a transform receives it (its sample id: the row)."""
    from stoker.pipeline.transforms import Sample

    return Sample(row, reader.key(row), reader.label(row), reader.jpeg(row))


class DelayProxy:
    """A TCP relay that holds every chunk `delay_s` before passing it on, both ways: a far link, made
    in user space because this machine's kernel has no sch_netem for `tc netem delay`. `routes`:
    (listen host, port) -> (target host, port), each with its own delay. `bytes_per_s`: each
    connection's chunks also leave no faster than this, each way (a slow store). An asyncio loop on a
    thread."""

    def __init__(self, routes: dict[tuple[str, int], tuple[tuple[str, int], float]],
                 bytes_per_s: float | None = None) -> None:
        import asyncio

        self.routes = routes
        self.bytes_per_s = bytes_per_s
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="delay-proxy", daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the delay proxy did not start"

    def _serve(self) -> None:
        import asyncio

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
            held: asyncio.Queue = asyncio.Queue()

            async def deliver() -> None:
                while (item := await held.get()) is not None:
                    due, data = item
                    await asyncio.sleep(max(0.0, due - self.loop.time()))
                    writer.write(data)
                    await writer.drain()
                writer.close()

            sending = asyncio.ensure_future(deliver())
            free_at = 0.0  # when the rate limit lets the next chunk leave
            while data := await reader.read(1 << 16):
                due = max(self.loop.time() + delay_s, free_at)
                if self.bytes_per_s:
                    free_at = due + len(data) / self.bytes_per_s
                    due = free_at
                held.put_nowait((due, data))
            held.put_nowait(None)
            await sending

        def relay(target: tuple[str, int], delay_s: float):
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                up_reader, up_writer = await asyncio.open_connection(*target)
                await asyncio.gather(pump(reader, up_writer, delay_s), pump(up_reader, writer, delay_s),
                                     return_exceptions=True)
            return handle

        async def start() -> None:
            for (host, port), (target, delay_s) in self.routes.items():
                await asyncio.start_server(relay(target, delay_s), host, port)
            self.ready.set()

        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def descendants(pid: int) -> dict[int, list[str]]:
    """Every live descendant of `pid` and its command line (arguments), read from /proc: the processes a
    launcher, a loader or a daemon started, however deep."""
    parents: dict[int, int] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p: commands[p] for p in found}
