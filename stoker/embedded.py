"""`stoker run`: dispatcher + consumer in this process, worker daemons as child processes.

Each worker daemon is a real `stoker worker` process (one per emulated host) talking to the
consumer over loopback TCP, exactly as daemons on separate hosts would. The daemons die with
this process (workers.lifeline), and a daemon that exits with an error before the job is done
(a port in use, say) ends the run with its message instead of leaving it waiting.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from accel.accelerators import AccelSpec, NullAccelerator, make_accelerator
from accel.consumer import Consumer, ConsumerConfig, Summary
from accel.job import JobConfig
from stoker.datasets import default_imagenet, default_wikipedia


@dataclass(frozen=True)
class RunConfig:
    data: str | None = None  # manifest; None: the default set of the dataset
    dataset: str = "imagenet"  # or "wikipedia"
    images: int = 2000  # size of the default set
    hosts: int = 2
    procs: int = 1
    accel: AccelSpec = AccelSpec()
    consumer: ConsumerConfig = ConsumerConfig()
    worker_metrics_port: int | None = 9561  # host i serves on this + i
    progress: bool = True
    log_level: str = "WARNING"


def worker_command(connect: str, host_id: str, procs: int, metrics_port: int | None, log_level: str) -> list[str]:
    cmd = [sys.executable, "-m", "stoker", "--log-level", log_level, "worker", "--connect", connect,
           "--procs", str(procs), "--host-id", host_id, "--once", "--parent-pid", str(os.getpid())]
    cmd += ["--metrics-port", str(metrics_port)] if metrics_port is not None else ["--no-metrics"]
    return cmd


class DaemonProcess:
    """A `stoker worker` child whose stderr is passed through and its last lines kept, for the error."""

    def __init__(self, host_id: str, cmd: list[str]) -> None:
        self.host_id = host_id
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
        self.tail: collections.deque[str] = collections.deque(maxlen=5)
        self._reader = threading.Thread(target=self._relay, name=f"stoker-{host_id}-stderr", daemon=True)
        self._reader.start()

    def _relay(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                self.tail.append(line.strip())

    def failure(self) -> str | None:
        """Why the daemon ended early: None while it runs or after a clean exit."""
        code = self.proc.poll()
        if code is None or code == 0:
            return None
        self._reader.join(timeout=2)
        last = self.tail[-1] if self.tail else "(no output)"
        return f"worker daemon {self.host_id} exited with code {code}: {last}"


def _watch(daemons: list[DaemonProcess], consumer: Consumer, done: threading.Event) -> None:
    """End the run with the first daemon's failure (it cannot deliver its share of the job)."""
    while not done.wait(0.2):
        for daemon in daemons:
            failure = daemon.failure()
            if failure is not None:
                consumer.abort(RuntimeError(failure))
                return


class Progress:
    def __init__(self, total: int, enabled: bool, dataset: str = "imagenet") -> None:
        unit = "doc" if dataset == "wikipedia" else "img"
        self.bar = tqdm(total=total, unit=unit, desc="stoker run", disable=not enabled, smoothing=0.1)
        self.last = 0.0

    def __call__(self, consumer: Consumer, force: bool = False) -> None:
        now = time.monotonic()
        if now - self.last < 0.25 and not force:
            return
        self.last = now
        stats = consumer.dispatcher.stats()
        self.bar.set_postfix_str(f"queue={consumer.queue.qsize()} units={stats.done}/{consumer.dispatcher.total_units}"
                                 f" hosts={stats.hosts_alive}", refresh=False)
        self.bar.update(consumer.ledger.samples - self.bar.n)

    def close(self, consumer: Consumer) -> None:
        self(consumer, force=True)
        self.bar.close()


def run_embedded(job_args: dict, cfg: RunConfig) -> Summary:
    """Run one job end to end; job_args are JobConfig fields other than manifest_uri."""
    if cfg.data:
        manifest = cfg.data
    elif cfg.dataset == "wikipedia":
        manifest = str(default_wikipedia(progress=cfg.progress))
    else:
        manifest = str(default_imagenet(cfg.images, progress=cfg.progress))
    job = JobConfig(manifest_uri=manifest, dataset=cfg.dataset, **job_args)
    consumer = Consumer(cfg.consumer, job, NullAccelerator())
    consumer.accelerator = make_accelerator(cfg.accel, job.dataset, len(consumer.manifest.classes),
                                            consumer.manifest.vocab_size, job.text.seq_len)
    consumer.start()
    daemons: list[DaemonProcess] = []
    progress = Progress(job.epochs * consumer.manifest.num_samples, cfg.progress, job.dataset)
    done = threading.Event()
    try:
        for i in range(cfg.hosts):
            port = None if cfg.worker_metrics_port is None else cfg.worker_metrics_port + i
            cmd = worker_command(consumer.control_endpoint, f"host{i}", cfg.procs, port, cfg.log_level)
            daemons.append(DaemonProcess(f"host{i}", cmd))
        threading.Thread(target=_watch, args=(daemons, consumer, done), name="stoker-daemon-watch", daemon=True).start()
        summary = consumer.run(on_step=progress, procs_per_host=cfg.procs)
        progress.close(consumer)
    finally:
        done.set()
        _stop_daemons([d.proc for d in daemons], timeout_s=15.0 if consumer.dispatcher.finished else 0.0)
        consumer.stop()
    return summary


def _stop_daemons(daemons: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in daemons:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
    for proc in daemons:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def print_summary(summary: Summary, json_path: str | None) -> None:
    s = summary
    noun = "documents" if s.dataset == "wikipedia" else "samples"
    procs = f" x {s.procs_per_host} process(es)" if s.procs_per_host else ""
    print(f"delivered {s.samples} {noun} ({s.unique_samples} unique) in {s.epochs} epoch(s) from "
          f"{s.hosts} host(s){procs}: {s.delivered_samples_per_s:.0f} {noun}/s, "
          f"stall {100 * s.stall_fraction:.1f}%, start-up {s.startup_s:.1f} s, total {s.elapsed_s:.1f} s")
    print(f"duplicates dropped: {s.duplicates_dropped}; {noun} skipped as unusable: {s.skipped_samples}; "
          f"messages dropped: {sum(s.frames_dropped.values())}; units re-leased: {s.units_released}")
    if s.tokens is not None:
        print(f"text: {s.sequences} sequences in {s.rows} rows, {s.sequences_per_s:.0f} sequences/s, "
              f"{s.tokens_per_s:.0f} tokens/s; padding {100 * s.padding_fraction:.1f}% as sent, "
              f"{100 * s.padding_fraction_before_packing:.1f}% with one sequence per row")
    stages = ", ".join(f"{k} {v:.2f}" for k, v in s.stage_seconds.items())
    print(f"stage seconds: {stages}")
    if json_path:
        Path(json_path).write_text(json.dumps(s.as_dict(), indent=1))
        print(f"summary written to {json_path}")
