"""`stoker worker`: the per-host daemon.

Registers with the dispatcher (retrying with back-off until it answers), runs N decode
processes, heartbeats, restarts a crashed process (its unacked units go back to the
dispatcher first), and drains on SIGTERM/SIGINT. Serves the processes' combined metrics.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import time
from dataclasses import dataclass

import zmq
from prometheus_client import multiprocess

from protos import stoker_pb2 as pb
from protos.curve import ClientKeys
from protos.sd_notify import Notifier
from workers.control_client import ControlClient, DispatcherUnreachable
from workers.metrics import WorkerMetrics, serve_multiprocess
from workers.process import EXIT_BAD_JOB, EXIT_FINISHED, ProcessSpec, process_main

log = logging.getLogger("stoker.worker")


@dataclass(frozen=True)
class WorkerConfig:
    connect: str  # dispatcher control endpoint
    procs: int = 1
    host_id: str = ""
    metrics_port: int | None = 9561
    metrics_addr: str = "127.0.0.1"
    once: bool = False  # exit after one job instead of waiting for the next
    drain_timeout_s: float = 10.0
    dispatcher_lost_s: float = 30.0  # leave a job whose dispatcher stays silent this long
    keys: str | None = None  # CURVE key folder (server.key + workers/<key_name>.key_secret)
    key_name: str = ""

    def resolved_host_id(self) -> str:
        return self.host_id or f"{socket.gethostname()}-{os.getpid()}"


class _Child:
    def __init__(self, index: int) -> None:
        self.index = index
        self.incarnation = 0
        self.process: mp.process.BaseProcess | None = None
        self.finished = False


class WorkerDaemon:
    def __init__(self, cfg: WorkerConfig) -> None:
        if cfg.procs < 1:
            raise ValueError("--procs must be at least 1")
        self.cfg = cfg
        self.host_id = cfg.resolved_host_id()
        self.metrics = WorkerMetrics()
        self.stopping = False
        self.ctx = zmq.Context()
        self.curve = ClientKeys.load(cfg.keys, cfg.key_name or self.host_id) if cfg.keys else None
        self.client = ControlClient(self.ctx, cfg.connect, f"{self.host_id}/daemon", curve=self.curve)
        self.mp = mp.get_context("spawn")
        self.metrics_port: int | None = None
        self.systemd = Notifier()
        self._finished_job = ""
        self.failed = False  # a process could not serve the job at all

    def _request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("%s: %s received, draining", self.host_id, signal.Signals(signum).name)
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        if self.cfg.metrics_port is not None:
            self.metrics_port = serve_multiprocess(self.cfg.metrics_port, self.cfg.metrics_addr)
            log.info("%s: metrics on http://%s:%d/metrics", self.host_id, self.cfg.metrics_addr,
                     self.metrics_port)
        self.systemd.ready(f"registering with {self.cfg.connect}")
        try:
            while not self.stopping:
                job = self._register()
                if job is None:
                    break
                self._run_job(job)
                self._finished_job = job.job_id
                if self.cfg.once:
                    break
        finally:
            self.systemd.stopping()
            self.client.close()
            self.ctx.term()
        return 1 if self.failed else 0

    def _should_stop(self) -> bool:
        """Polled while waiting for the dispatcher: the main loop is alive, so it feeds the watchdog."""
        self.systemd.watchdog()
        return self.stopping

    def _register(self) -> pb.JobSpec | None:
        """Wait for a dispatcher (back-off inside the client) and take its job."""
        log.info("%s: registering with %s", self.host_id, self.cfg.connect)
        while not self.stopping:
            try:
                reply = self.client.request(pb.ControlRequest(register=pb.Register(
                    host_id=self.host_id, procs=self.cfg.procs, pid=os.getpid())),
                    give_up_after_s=None, should_stop=self._should_stop)
            except DispatcherUnreachable:
                return None
            if reply.WhichOneof("kind") == "registered" and reply.registered.job.job_id != self._finished_job:
                log.info("%s: joined job %s, data to %s", self.host_id, reply.registered.job.job_id,
                         reply.registered.job.data_endpoint)
                return reply.registered.job
            time.sleep(1.0)  # the dispatcher still serves the job we finished: wait for a new one
        return None

    def _spawn(self, child: _Child, job: pb.JobSpec) -> None:
        child.incarnation += 1
        worker_id = self._worker_id(child)
        spec = ProcessSpec(self.host_id, worker_id, self.cfg.connect, job.SerializeToString(), self.curve)
        child.process = self.mp.Process(target=process_main, args=(spec,), name=worker_id, daemon=False)
        child.process.start()

    def _worker_id(self, child: _Child) -> str:
        return f"{self.host_id}/p{child.index}.{child.incarnation}"

    def _run_job(self, job: pb.JobSpec) -> None:
        children = [_Child(i) for i in range(self.cfg.procs)]
        for child in children:
            self._spawn(child, job)
        next_beat = 0.0
        finished_at: float | None = None
        last_answer = time.monotonic()
        while not self.stopping and not all(c.finished for c in children):
            live = [c.process.sentinel for c in children if not c.finished and c.process is not None]
            mp.connection.wait(live, timeout=min(job.heartbeat_s, 0.5))
            self.systemd.watchdog()
            for child in children:
                self._reap(child, job, finished_at is not None)
            if time.monotonic() >= next_beat:
                answer = self._heartbeat(children)
                next_beat = time.monotonic() + job.heartbeat_s
                if answer is not None:
                    last_answer = time.monotonic()
                if answer == "finished" and finished_at is None:
                    finished_at = time.monotonic()
            now = time.monotonic()
            if finished_at is not None and now - finished_at > self.cfg.drain_timeout_s:
                log.info("%s: job finished; stopping processes that are still busy", self.host_id)
                break
            if now - last_answer > self.cfg.dispatcher_lost_s:
                log.error("%s: the dispatcher has not answered for %.0f s; leaving job %s",
                          self.host_id, now - last_answer, job.job_id)
                break
        self._drain(children, release=self.stopping)

    def _reap(self, child: _Child, job: pb.JobSpec, job_finished: bool) -> None:
        proc = child.process
        if child.finished or proc is None or proc.is_alive():
            return
        proc.join()
        multiprocess.mark_process_dead(proc.pid)
        if proc.exitcode == EXIT_FINISHED or self.stopping:
            child.finished = True
            return
        if proc.exitcode == EXIT_BAD_JOB:  # restarting cannot help; the process logged why
            log.error("%s: process %s cannot serve job %s; not restarting it", self.host_id,
                      self._worker_id(child), job.job_id)
            self.failed = True
            child.finished = True
            return
        worker_id = self._worker_id(child)
        log.warning("%s: process %s (pid %s) died with exit code %s; handing its units back and restarting",
                    self.host_id, worker_id, proc.pid, proc.exitcode)
        self._release([worker_id], f"process exit {proc.exitcode}")
        self.metrics.restarts.inc()
        if job_finished:
            child.finished = True
            return
        self._spawn(child, job)
        log.warning("%s: restarted as %s (pid %s)", self.host_id, self._worker_id(child), child.process.pid)

    def _heartbeat(self, children: list[_Child]) -> str | None:
        """Tell the dispatcher we are alive; returns its answer's kind, None if unanswered."""
        ids = [self._worker_id(c) for c in children if not c.finished]
        try:
            reply = self.client.request(pb.ControlRequest(heartbeat=pb.Heartbeat(
                host_id=self.host_id, worker_ids=ids)), give_up_after_s=5.0, should_stop=lambda: self.stopping)
        except DispatcherUnreachable as exc:
            if not self.stopping:
                log.warning("%s: heartbeat unanswered: %s", self.host_id, exc)
            return None
        return reply.WhichOneof("kind")

    def _release(self, worker_ids: list[str], reason: str) -> None:
        try:
            self.client.request(pb.ControlRequest(release=pb.Release(
                host_id=self.host_id, worker_ids=worker_ids, reason=reason)), give_up_after_s=5.0)
        except DispatcherUnreachable as exc:
            log.warning("%s: could not hand units back (%s); the dispatcher re-leases them when our "
                        "heartbeats stop", self.host_id, exc)

    def _drain(self, children: list[_Child], release: bool) -> None:
        """SIGTERM every live process, wait for it, and optionally hand back unfinished units."""
        procs = [c.process for c in children if c.process is not None and c.process.is_alive()]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("%s: %s did not drain in time; killing it", self.host_id, proc.name)
                proc.kill()
                proc.join()
            multiprocess.mark_process_dead(proc.pid)
        if release:
            self._release([], "host draining")
            log.info("%s: drained", self.host_id)
