"""`stoker worker`: the per-host daemon.

Registers with the dispatcher (retrying with back-off until it answers), runs N decode
processes, heartbeats, restarts a crashed process (its unacked units go back to the
dispatcher first; one that keeps crashing is restarted with a growing back-off), and drains
on SIGTERM/SIGINT. A daemon that leaves a job because the dispatcher went silent keeps
registering and rejoins that job when it answers again, however long it was away. A daemon
whose dispatcher now serves another job (the job was started again without a checkpoint, so
under a new id) or another run of its job (a dispatcher that started again: a job resumed in
place from a checkpoint keeps its id, not its run id) leaves its job at once, stops the
processes of the old run (whatever they were doing: a send to a rank that died, a unit no
rank will take) and registers for the new one; a dispatcher whose job
is finished is waited on until it serves one that is not (a job resumed in place from an
earlier checkpoint runs again under its id), except by a --once daemon that left that very job:
its one job is over, so it exits. Serves the processes' combined metrics.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import secrets
import signal
import time
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized

import zmq
from prometheus_client import multiprocess

from stoker.pipeline.activity import ActivitySlot, Phase
from stoker.pipeline.job import JobConfig
from stoker.pipeline.job_wire import job_from_proto
from stoker.pipeline.store.shard_cache import CacheConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import MISDIRECTED, ControlClient, DispatcherUnreachable
from stoker.protos.curve import ClientKeys
from stoker.protos.leases import HOST_ID_IN_USE
from stoker.workers.decode_child import DecodeChild, exit_name, kill_if_frozen, watch_transform
from stoker.workers.limits import Room, is_out_of_tasks, out_of_tasks_line
from stoker.workers.metrics import WorkerMetrics
from stoker.workers.preamble import HostPreamble
from stoker.workers.process import EXIT_BAD_JOB, EXIT_FINISHED, EXIT_NO_TASKS, EXIT_OTHER_JOB, ProcessSpec, process_main
from stoker.workers.supervisor import Supervisor
from stoker.workers.task_budget import STEADY_S, TASKS_PER_PROCESS, TaskBudget
from stoker.workers.worker_config import WorkerConfig

log = logging.getLogger("stoker.worker")


RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0)  # by crashes in a row
HOST_ID_TAKEN_GIVE_UP_S = 6.0  # refused as a second daemon of a live host id this long: exit (the first lives)
FINISHED_GRACE_S = 2.0  # after the job is finished, processes still busy (nothing left to do) are stopped
# STEADY_S (workers.task_budget): a process that ran this long resets its crash count
SHORT_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # retries of a process the host could not start, in a row
# one thread each for BLAS and OpenMP in a decode process: it does not multiply matrices, and each of their
# threads is a task a host's pids limit counts (numpy's OpenBLAS starts one per core at import)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "JE_ARROW_MALLOC_CONF": "background_thread:false"}  # ... and none for pyarrow's jemalloc


class WorkerDaemon:
    """`target`: under a fleet (workers.fleet_agent), how many of its `procs` to run now, changed while
    it runs; a process it no longer needs drains and hands its units back before it exits.
    `expect_job`: with --once, the job to serve; a dispatcher that serves another is left at once."""

    def __init__(self, cfg: WorkerConfig, target: Synchronized | None = None, expect_job: str = "") -> None:
        self.host = HostPreamble(cfg, cfg.resolved_host_id())  # checks the settings first
        self.cfg = cfg
        self.cache = CacheConfig.from_env(cfg.shard_cache_gb)  # a bad $STOKER_SHARD_CACHE_GB fails here, at start
        self.host_id = self.host.host_id
        self.metrics = WorkerMetrics()
        self.stopping = False
        self.ctx = zmq.Context()
        self.curve = ClientKeys.load(cfg.keys, cfg.key_name or self.host_id) if cfg.keys else None
        # its own identity (a nonce): the dispatcher tells two daemons started with one host id apart
        self.client = ControlClient(self.ctx, cfg.connect, f"{self.host_id}/daemon.{secrets.token_hex(4)}",
                                    curve=self.curve)
        self.mp = mp.get_context("spawn")
        # a process that crashes is restarted after RESTART_BACKOFF_S; its metrics files go when it is reaped
        self.procs = Supervisor(self.mp, RESTART_BACKOFF_S, STEADY_S, on_exit=multiprocess.mark_process_dead)
        self.failed = False  # a process could not serve the job at all
        self._other_job = False  # the dispatcher serves another job (or run) than the one being run
        self._other_job_id = ""  # the job it serves then, when a heartbeat's answer said
        self._job_id = expect_job  # the job being run
        self.served_to_end = False  # it saw its job finished (a --once daemon's one job is over)
        self._job_over = False
        self._run_id = ""  # ... and the run of it this daemon registered with (Registered.run_id)
        self._incarnations: dict[int, int] = {}  # process index -> its last incarnation, across jobs
        self.target = target
        self.tasks = TaskBudget()  # the host's room for processes and threads (workers.limits)
        self._children: list[DecodeChild] = []  # the job's processes now (for the line that says how many run)
        for name, value in ONE_THREAD.items():
            os.environ.setdefault(name, value)  # the processes it spawns inherit them (the user's own win)

    def _request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping and self.target is not None:  # a fleet's job daemon: its host's daemon asks
            log.info("%s: job %s's processes here are to stop (the fleet gave them to other jobs, or the host "
                     "drains): draining", self.host_id, self._job_id)
        elif not self.stopping:
            log.info("%s: %s received, draining", self.host_id, signal.Signals(signum).name)
        self.stopping = True

    def run(self) -> int:
        self.host.begin(self._request_stop, f"registering with {self.cfg.connect}")
        try:
            while not self.stopping:
                job = self._register()
                if job is None:
                    break
                if self._run_job(job) and self.cfg.once:
                    self.served_to_end = True
                    break
        finally:
            self.host.end()
            self.client.close()
            self.ctx.term()
        return 1 if self.failed else 0

    def _should_stop(self) -> bool:
        """Polled while waiting for the dispatcher: the main loop is alive, so it feeds the watchdog."""
        if not self.host.alive():
            self.stopping = True
        return self.stopping

    def _register(self) -> JobConfig | None:
        """Wait for a dispatcher (back-off inside the client) and take its job."""
        log.info("%s: registering with %s", self.host_id, self.cfg.connect)
        refused_since: float | None = None
        while not self.stopping:
            try:
                reply = self.client.request(pb.ControlRequest(register=pb.Register(
                    host_id=self.host_id, procs=self.cfg.procs, pid=os.getpid())),
                    give_up_after_s=None, should_stop=self._should_stop)
            except DispatcherUnreachable:
                return None
            if reply.WhichOneof("kind") == "registered":
                if self.cfg.once and self._job_id and reply.registered.job.job_id != self._job_id:
                    log.info("%s: the dispatcher at %s serves job %s now, not job %s that this daemon served; "
                             "--once: exiting", self.host_id, self.cfg.connect, reply.registered.job.job_id,
                             self._job_id)
                    return None
                log.info("%s: joined job %s, data to %s", self.host_id, reply.registered.job.job_id,
                         reply.registered.job.data_endpoint)
                self._run_id = reply.registered.run_id
                return job_from_proto(reply.registered.job)
            if reply.WhichOneof("kind") == "error":
                # another daemon under this host id, or a key not allow-listed: say so; a daemon that just
                # restarted waits for its dead predecessor to fall silent, a second live one gives up
                if refused_since is None:
                    log.error("%s: the dispatcher refused to register this host: %s", self.host_id,
                              reply.error.message)
                    refused_since = time.monotonic()
                if reply.error.reason == MISDIRECTED or HOST_ID_IN_USE in reply.error.message and \
                        time.monotonic() - refused_since > HOST_ID_TAKEN_GIVE_UP_S:
                    log.error("%s: exiting: %s", self.host_id, reply.error.message)
                    self.failed = True
                    return None
                time.sleep(1.0)
                continue
            if self.cfg.once and self._job_id and reply.finished.job_id == self._job_id:
                log.info("%s: job %s finished while this host was away; --once: exiting", self.host_id, self._job_id)
                self.served_to_end = True
                return None
            time.sleep(1.0)  # its job is finished: wait for one that is not
        return None

    def _spawn(self, child: DecodeChild, job: JobConfig) -> BaseProcess | None:
        """Start the child's next incarnation; returns its process (also `child.process`), or None when the
        host could not start one (out of processes, threads or memory): then it tries again after a back-off."""
        child.incarnation += 1
        self._incarnations[child.index] = child.incarnation
        child.restart_at = None
        child.started = time.monotonic()
        worker_id = self._worker_id(child)
        if child.activity is None:
            child.activity = ActivitySlot(self.mp)
        child.activity.set(Phase.IDLE)
        child.stuck_on = None
        spec = ProcessSpec(self.host_id, worker_id, self.cfg.connect, job, os.getpid(), self.curve, self.cache,
                           self._run_id, child.activity, self.cfg.procs)
        short = self.tasks.no_room()
        if short is not None:  # it would fail to start, or abort starting a thread
            room, coming = short
            self._short_of_tasks(child, f"cannot start worker process {worker_id} (room for {room.tasks} more tasks, "
                                        f"{coming} of them for processes starting now; one needs about "
                                        f"{TASKS_PER_PROCESS})", room)
            return None
        try:
            process = self.procs.start(child, process_main, (spec,), worker_id)
        except (OSError, RuntimeError) as exc:
            if not is_out_of_tasks(exc):
                raise
            self._short_of_tasks(child, f"cannot start worker process {worker_id} ({exc})")
            return None
        self.tasks.started(process)
        return process

    def _short_of_tasks(self, child: DecodeChild, what: str, short: Room | None = None) -> None:
        """The host could not start a process or a thread for `child`: one line (again at most every
        SHORT_SAID_EVERY_S) naming the limit met, and another try after a back-off; the other processes
        go on, and so does the daemon."""
        child.short += 1
        delay = SHORT_BACKOFF_S[min(child.short - 1, len(SHORT_BACKOFF_S) - 1)]
        child.restart_at = time.monotonic() + delay
        if self.tasks.say_short():
            running = sum(c.process is not None and c.process.is_alive() and c.restart_at is None
                          for c in self._children)
            log.error("%s: %s; trying again in %.0f s (%d of this host's %d processes run meanwhile)", self.host_id,
                      out_of_tasks_line(what, short, TASKS_PER_PROCESS), delay, running, self.cfg.procs)
        self.metrics.short_of_tasks.inc()

    def _worker_id(self, child: DecodeChild) -> str:
        return f"{self.host_id}/p{child.index}.{child.incarnation}"

    def _run_job(self, job: JobConfig) -> bool:
        """Serve one job; True when it is finished, False when we left it (or were stopped)."""
        children = self._children = [DecodeChild(i, self._incarnations.get(i, 0)) for i in range(self._wanted())]
        self._other_job, self._other_job_id, self._job_id = False, "", job.job_id
        self._job_over = False  # a process said the job is finished: none is started for it any more
        for child in children:
            self._spawn(child, job)
        next_beat = 0.0
        finished_at: float | None = None
        last_answer = time.monotonic()
        left = False
        while not self.stopping and not all(c.finished for c in children):
            live = [c.process.sentinel for c in children
                    if not c.finished and c.process is not None and c.restart_at is None]
            mp.connection.wait(live, timeout=min(job.heartbeat_s, 0.5))
            if not self.host.alive():
                log.warning("%s: the process that started this daemon is gone; stopping", self.host_id)
                self.stopping = True
                break
            for child in children:
                kill_if_frozen(child, self.host_id, self._worker_id(child))
                watch_transform(child, job, self.host_id, self._worker_id(child), self._run_id, self.client)
                self._reap(child, job, finished_at is not None)
            if finished_at is None:
                children = self._children = self._resize(children, job)
            if finished_at is None and time.monotonic() >= next_beat:  # once finished, nobody listens any more
                answer = self._heartbeat(children)
                next_beat = time.monotonic() + job.heartbeat_s
                if answer is not None:
                    last_answer = time.monotonic()
                if answer == "finished" and finished_at is None:
                    finished_at = time.monotonic()
                if answer == "other_job":
                    self._other_job = True
            if self._other_job:
                if not self._other_job_id:  # a process heard it first: ask which job, or run, it is
                    self._heartbeat(children)
                self._say_other_job(job)
                left = True
                break
            now = time.monotonic()
            if finished_at is not None and now - finished_at > FINISHED_GRACE_S:
                log.info("%s: job finished; stopping processes that are still busy", self.host_id)
                break
            if now - last_answer > self.cfg.leave_after_s:
                log.error("%s: the dispatcher has not answered for %.0f s; leaving job %s (registering again, "
                          "to rejoin it when it answers)", self.host_id, now - last_answer, job.job_id)
                left = True
                break
        self._drain(children, release=self.stopping and not self.host.parent_gone())
        return not left and not self._other_job and not self.stopping

    def _wanted(self) -> int:
        """The processes to run: all of --procs, or as many of them as the fleet gives this job now."""
        if self.target is None:
            return self.cfg.procs
        return max(1, min(self.cfg.procs, int(self.target.value)))

    def _resize(self, children: list[DecodeChild], job: JobConfig) -> list[DecodeChild]:
        """Under a fleet: start processes up to the target, or drain the newest beyond it (SIGTERM: each
        finishes the batch in hand; `_reap` hands its units back once it has exited)."""
        if self.target is None or self._job_over or self.failed:  # over, or this host cannot serve it
            return children
        children = [c for c in children if not (c.finished and c.retire_by is not None)]  # retired: gone
        active = [c for c in children if not c.finished and c.retire_by is None]
        want = self._wanted()
        if len(active) < want:
            used = {c.index for c in children if not c.finished}
            for index in [i for i in range(self.cfg.procs) if i not in used][:want - len(active)]:
                child = DecodeChild(index, self._incarnations.get(index, 0))
                children.append(child)
                process = self._spawn(child, job)
                if process is not None:
                    log.info("%s: the fleet gives job %s %d processes: started %s (pid %s)", self.host_id,
                             job.job_id, want, self._worker_id(child), process.pid)
        for child in sorted(active, key=lambda c: -c.index)[:max(0, len(active) - want)]:
            child.retire_by = time.monotonic() + self.cfg.drain_timeout_s
            log.info("%s: the fleet gives job %s %d processes: draining %s", self.host_id, job.job_id, want,
                     self._worker_id(child))
            if child.process is not None and child.process.is_alive() and child.restart_at is None:
                child.process.terminate()
        return children

    def _retire(self, child: DecodeChild) -> None:
        """A process the fleet moved: once it has exited (or past its drain time, killed), its units go back."""
        proc = child.process
        if child.restart_at is None and proc is not None and proc.is_alive():
            if time.monotonic() < (child.retire_by or 0.0):
                return
            log.warning("%s: %s did not drain in time; killing it", self.host_id, proc.name)
            self.procs.kill(child)
        if proc is not None:
            self.procs.reap(child)
            self._release([self._worker_id(child)], "moved to another job")
            log.info("%s: %s drained (moved to another job); its units are back with the dispatcher", self.host_id,
                     self._worker_id(child))
        child.finished = True

    def _say_other_job(self, job: JobConfig) -> None:
        if not self._other_job_id:
            log.warning("%s: the dispatcher at %s serves another job than %s, or another run of it, now: stopping "
                        "this run's processes to register again", self.host_id, self.cfg.connect, job.job_id)
        elif self._other_job_id == job.job_id:
            log.warning("%s: the dispatcher at %s runs job %s anew (a new run: it started again, or the job resumed "
                        "from a checkpoint): stopping this run's processes to join the new run", self.host_id,
                        self.cfg.connect, job.job_id)
        else:
            log.warning("%s: the dispatcher at %s serves another job than %s now (the job was started again): "
                        "leaving it to register for that one", self.host_id, self.cfg.connect, job.job_id)

    def _reap(self, child: DecodeChild, job: JobConfig, job_finished: bool) -> None:
        proc = child.process
        if child.retire_by is not None:
            if not child.finished:
                self._retire(child)
            return
        if child.restart_at is not None:
            if job_finished:
                child.finished = True
            elif self.procs.due(child):
                process = self._spawn(child, job)
                if process is not None and not child.short:
                    log.warning("%s: restarted as %s (pid %s)", self.host_id, self._worker_id(child), process.pid)
            return
        if child.finished or proc is None:
            return
        if self.procs.reap(child) is None:  # it runs
            if child.short and time.monotonic() - child.started >= STEADY_S:
                child.short = 0  # it started and keeps running: the host had room after all
            return
        if proc.exitcode == EXIT_FINISHED or self.stopping:
            child.finished = True
            self._job_over = self._job_over or not self.stopping  # a process that was not told to stop: no more work
            return
        if proc.exitcode == EXIT_OTHER_JOB:
            self._other_job = True
            child.finished = True
            return
        if proc.exitcode == EXIT_NO_TASKS or (proc.exitcode == -signal.SIGABRT and self.tasks.refused_a_task()):
            self._release([self._worker_id(child)], "process could not start a thread")
            self._short_of_tasks(child, f"worker process {self._worker_id(child)} could not start a thread")
            return
        if proc.exitcode == EXIT_BAD_JOB:  # restarting cannot help; the process logged why
            log.error("%s: process %s cannot serve job %s; not restarting it", self.host_id,
                      self._worker_id(child), job.job_id)
            self.failed = True
            child.finished = True
            return
        self._crashed(child, job, job_finished)

    def _crashed(self, child: DecodeChild, job: JobConfig, job_finished: bool) -> None:
        """A process died before the job was over: say how (and on which sample, which the dispatcher
        counts towards poison), hand its units back, and restart it after its back-off."""
        proc = child.process
        assert proc is not None, "_reap: only a process that ran has crashed"
        worker_id = self._worker_id(child)
        how = ("exited 0 before the job was finished (something in it called exit(): the transform, or a library "
               "it uses)") if proc.exitcode == 0 else f"died ({exit_name(proc.exitcode)})"
        last = child.activity.read() if child.activity is not None else None
        crashed_sample = None
        if child.stuck_on is not None:  # reported as hung: the dispatcher skips the sample already
            how = f"was killed, stuck in the transform of sample {child.stuck_on}"
        elif last is not None and last.phase == Phase.TRANSFORMING:
            crashed_sample = last.sample_id
            how += f" while transforming sample {crashed_sample} of unit {last.unit_id}"
        log.warning("%s: process %s (pid %s) %s; handing its units back and restarting", self.host_id, worker_id,
                    proc.pid, how)
        self._release([worker_id], f"process exit {exit_name(proc.exitcode).removeprefix('exit code ')}",
                      crashed_sample)
        self.metrics.restarts.inc()
        if job_finished:
            child.finished = True
            return
        if child.stuck_on is not None:  # no crash of its own: it starts again at once
            child.crashes = 0
        delay = self.procs.crashed(child)  # RESTART_BACKOFF_S by its crashes in a row
        if delay:
            log.warning("%s: process %s crashed %d time(s) in a row; restarting it in %.1f s", self.host_id,
                        worker_id, child.crashes, delay)
        self._reap(child, job, job_finished)

    def _heartbeat(self, children: list[DecodeChild]) -> str | None:
        """Tell the dispatcher we are alive; returns its answer's kind, None if unanswered."""
        live = [c for c in children if not c.finished]
        beat = pb.Heartbeat(host_id=self.host_id, worker_ids=[self._worker_id(c) for c in live], job_id=self._job_id,
                            run_id=self._run_id)
        for child in live:
            if child.activity is not None and child.restart_at is None:
                now = child.activity.read()
                beat.activity.add(worker_id=self._worker_id(child), phase=now.name, unit_id=max(now.unit_id, 0),
                                  sample_id=now.sample_id, for_s=now.for_s)
        try:
            reply = self.client.request(pb.ControlRequest(heartbeat=beat), give_up_after_s=5.0,
                                        should_stop=lambda: self.stopping)
        except DispatcherUnreachable as exc:
            if not self.stopping:
                log.warning("%s: heartbeat unanswered: %s", self.host_id, exc)
            return None
        if reply.WhichOneof("kind") == "other_job":
            self._other_job_id = reply.other_job.job_id
        return reply.WhichOneof("kind")

    def _release(self, worker_ids: list[str], reason: str, crashed_sample: int | None = None) -> None:
        """Hand the units of `worker_ids` (all: the host's) back; `crashed_sample`: the process died
        transforming it (the dispatcher skips a sample that did so twice)."""
        release = pb.Release(host_id=self.host_id, worker_ids=worker_ids, reason=reason,
                             # a whole host's release holds in any run (it drains); a process's, only in its run
                             run_id=self._run_id if worker_ids else "")
        if crashed_sample is not None:
            release.crashed_sample = crashed_sample
        try:
            self.client.request(pb.ControlRequest(release=release), give_up_after_s=5.0)
        except DispatcherUnreachable as exc:
            log.warning("%s: could not hand units back (%s); the dispatcher re-leases them when our "
                        "heartbeats stop", self.host_id, exc)

    def _drain(self, children: list[DecodeChild], release: bool) -> None:
        """SIGTERM every live process, wait for it (--drain-timeout, then killed), and optionally hand back
        unfinished units."""
        self.procs.drain(children, self.cfg.drain_timeout_s, on_late=lambda child: log.warning(
            "%s: %s did not drain in time; killing it", self.host_id, self._worker_id(child)))  # its process's name
        if release:
            self._release([], "host draining")
            log.info("%s: drained", self.host_id)
