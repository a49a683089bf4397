"""`stoker worker --fleet ENDPOINT`: a host that serves whichever jobs a fleet gives it.

The daemon beats to the fleet once a second with its capacity (--procs) and what it runs; the
fleet answers with how many processes each job should have here and where that job's dispatcher
is. For each job the daemon runs one job daemon (workers.daemon.WorkerDaemon, in a process of its
own, registered with that job's dispatcher as a daemon without a fleet would be), and changes its
process count in place: a process the fleet moves to another job drains (finishes its batch, its
units go back to its job's dispatcher) before the other job's starts. One job per process: a job's
transform that crashes its process crashes nothing of another job's.

The fleet keeps no state: what this host runs is in every beat, so a fleet that starts again
learns it back. While the fleet does not answer, the host keeps running what it has (nothing is
lost, nothing moves) and keeps beating. SIGTERM drains every job's processes, as without a fleet.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from dataclasses import replace
from multiprocessing.sharedctypes import Synchronized

import zmq

from stoker.pipeline.cpu_clock import usable_cores
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import MISDIRECTED, ControlClient, DispatcherUnreachable
from stoker.protos.curve import ClientKeys
from stoker.protos.sockets import end_context
from stoker.workers.preamble import HostPreamble, configure_logging
from stoker.workers.supervisor import Supervised, Supervisor
from stoker.workers.worker_config import WorkerConfig

log = logging.getLogger("stoker.worker")

EXIT_JOB_OVER = 0  # a job daemon whose job is finished
EXIT_LEFT = 3  # ... that was stopped, or left its job (the fleet may start it again)
EXIT_FAILED = 1  # ... whose processes cannot serve its job (they said why)
BEAT_S = 1.0  # how often the host tells the fleet what it runs (and hears what it should)
BEAT_ANSWER_S = 2.0  # a beat unanswered this long is given up; the next one goes a beat later
RESPAWN_AFTER_S = 2.0  # a job daemon that died (not one whose job finished) is started again after this
STOP_MARGIN_S = 5.0  # beyond a job daemon's own drain time, before it is killed


class _JobDaemon(Supervised):
    def __init__(self, job_id: str, endpoint: str, target: Synchronized) -> None:
        super().__init__()
        self.job_id, self.endpoint, self.target = job_id, endpoint, target
        self.draining = False  # told to stop (SIGTERM): its processes hand their units back, then it exits

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


def job_daemon_main(cfg: WorkerConfig, job_id: str, target: Synchronized, log_level: int) -> None:
    """A job daemon's process: serve `job_id` at `cfg.connect` with `target` processes, then exit."""
    from stoker.workers.daemon import WorkerDaemon

    configure_logging(log_level)
    daemon = WorkerDaemon(cfg, target=target, expect_job=job_id)
    failed = daemon.run()
    raise SystemExit(EXIT_FAILED if failed else EXIT_JOB_OVER if daemon.served_to_end else EXIT_LEFT)


class FleetAgent:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.host = HostPreamble(cfg, cfg.resolved_host_id())  # checks the settings first
        self.cfg = cfg
        self.host_id = self.host.host_id
        self.ctx = zmq.Context()
        self.curve = ClientKeys.load(cfg.keys, cfg.key_name or self.host_id) if cfg.keys else None
        self.client = ControlClient(self.ctx, cfg.fleet, f"{self.host_id}/fleet.{os.getpid()}", curve=self.curve,
                                    fleet=True)
        self.mp = mp.get_context("spawn")
        self.procs = Supervisor(self.mp, (RESPAWN_AFTER_S,), steady_s=0.0)  # the job daemons
        self.jobs: dict[str, _JobDaemon] = {}
        self.finished: dict[str, float] = {}  # job -> when its daemon said it finished: not started again
        self.respawn_at: dict[str, float] = {}  # job -> when a job daemon that died may be started again
        self.stopping = False
        self._unanswered_since: float | None = None
        self._refused = ""  # the fleet's last refusal, said once
        self.misdirected = False  # the address given as the fleet's is a dispatcher's

    def _request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("%s: %s received, draining every job's processes", self.host_id, signal.Signals(signum).name)
        self.stopping = True

    def run(self) -> int:
        self.host.begin(self._request_stop, f"beating to the fleet at {self.cfg.fleet}")
        log.info("%s: serving the fleet at %s with %d processes", self.host_id, self.cfg.fleet, self.cfg.procs)
        try:
            while not self.stopping:
                started = time.monotonic()
                self._reap()
                plan = self._beat(leaving=False)
                if plan is not None:
                    self._follow(plan)
                if not self.host.alive():
                    log.warning("%s: the process that started this daemon is gone; stopping", self.host_id)
                    self.stopping = True
                self._sleep(BEAT_S - (time.monotonic() - started))
        finally:
            self.host.end()
            self._beat(leaving=True)  # best effort: the fleet stops counting this host at once
            self._stop_all()
            self.client.close()
            end_context(self.ctx)  # nothing left to wait on: a gone fleet cannot hold the exit
        return 1 if self.misdirected else 0

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + max(0.0, seconds)
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _beat(self, leaving: bool) -> pb.FleetPlan | None:
        beat = pb.FleetHost(host_id=self.host_id, procs=self.cfg.procs, pid=os.getpid(), leaving=leaving,
                            cores=min(float(self.cfg.procs), usable_cores()))
        for job in self.jobs.values():
            if job.alive():
                beat.serving.add(job_id=job.job_id, endpoint=job.endpoint, procs=int(job.target.value))
        try:
            reply = self.client.request(pb.FleetRequest(fleet_host=beat), give_up_after_s=BEAT_ANSWER_S)
        except DispatcherUnreachable as exc:
            now = time.monotonic()
            if self._unanswered_since is None and not leaving:
                self._unanswered_since = now
                log.warning("%s: the fleet at %s does not answer (%s); keeping the %d jobs this host runs",
                            self.host_id, self.cfg.fleet, exc, len(self.jobs))
            return None
        if self._unanswered_since is not None:
            log.info("%s: the fleet at %s answers again", self.host_id, self.cfg.fleet)
            self._unanswered_since = None
        if reply.WhichOneof("kind") == "error":
            if reply.error.message != self._refused:
                log.error("%s: the fleet at %s refused this host: %s", self.host_id, self.cfg.fleet,
                          reply.error.message)
            self._refused = reply.error.message
            if reply.error.reason == MISDIRECTED:  # not a fleet: beating again cannot help
                log.error("%s: exiting: %s", self.host_id, reply.error.message)
                self.stopping = self.misdirected = True
            return None
        self._refused = ""
        return reply.fleet_plan if reply.WhichOneof("kind") == "fleet_plan" else None

    def _follow(self, plan: pb.FleetPlan) -> None:
        """Start, resize or drain job daemons to match the plan."""
        wanted = {j.job_id: j for j in plan.jobs if j.procs > 0}
        self.finished = {job: at for job, at in self.finished.items() if job in wanted}  # a job resumed later: anew
        for job_id, job in list(self.jobs.items()):
            if (job_id not in wanted or wanted[job_id].endpoint != job.endpoint) and not job.draining:
                log.info("%s: the fleet gives job %s no processes here now; draining them", self.host_id, job_id)
                if job.process is not None:
                    job.process.terminate()
                job.draining = True
        for job_id, assigned in wanted.items():
            procs = min(assigned.procs, self.cfg.procs)
            known = self.jobs.get(job_id)
            if known is not None and known.endpoint == assigned.endpoint:
                if int(known.target.value) != procs:
                    log.info("%s: job %s: %d -> %d processes", self.host_id, job_id, int(known.target.value), procs)
                    known.target.value = procs
                continue
            if job_id in self.finished or (known is not None and known.alive()) \
                    or time.monotonic() < self.respawn_at.get(job_id, 0.0):
                continue  # finished here, still draining at its old dispatcher, or died a moment ago
            self._start(job_id, assigned.endpoint, procs)

    def _start(self, job_id: str, endpoint: str, procs: int) -> None:
        target = self.mp.Value("i", procs)
        cfg = replace(self.cfg, connect=endpoint, fleet="", metrics_port=None, once=True, parent_pid=os.getpid(),
                      host_id=self.host_id)
        level = logging.getLogger().getEffectiveLevel()
        job = _JobDaemon(job_id, endpoint, target)
        process = self.procs.start(job, job_daemon_main, (cfg, job_id, target, level), f"{self.host_id}/{job_id}")
        self.jobs[job_id] = job
        log.info("%s: serving job %s (dispatcher %s) with %d processes (pid %s)", self.host_id, job_id, endpoint,
                 procs, process.pid)

    def _reap(self) -> None:
        for job_id, job in list(self.jobs.items()):
            code = self.procs.reap(job)
            if code is None and job.process is not None:  # it runs
                continue
            del self.jobs[job_id]
            if code == EXIT_JOB_OVER:
                self.finished[job_id] = time.monotonic()
                log.info("%s: job %s is over here", self.host_id, job_id)
            elif code == EXIT_FAILED:
                self.finished[job_id] = time.monotonic()  # its processes said why; its dispatcher fails the job
                log.error("%s: this host cannot serve job %s (its processes said why); not starting it again",
                          self.host_id, job_id)
            elif code != EXIT_LEFT:
                delay = self.procs.crashed(job)  # RESPAWN_AFTER_S
                log.warning("%s: the daemon of job %s exited with %s; starting it again in %.0f s if the fleet still "
                            "gives it processes here", self.host_id, job_id, code, delay)
                self.respawn_at[job_id] = job.restart_at or 0.0

    def _stop_all(self) -> None:
        """SIGTERM every job daemon; one still running past its own drain time and STOP_MARGIN_S is killed."""
        self.procs.drain(self.jobs.values(), self.cfg.drain_timeout_s + STOP_MARGIN_S, on_late=lambda job: log.warning(
            "%s: the daemon of job %s did not drain in time; killing it", self.host_id, job.job_id))
        log.info("%s: drained", self.host_id)
