"""The control server's answers to worker daemons and processes: register, heartbeat, lease, release,
refuse, hung, poison (a fleet's beat sent here by mistake is no request of this envelope: dropped
unread, accel.control.serving.routing). One method per request kind, each
taking the request as a handler sees it (accel.control.serving.routing.Asked); the control server
(accel.control.serving.server) routes to them and sends what they return.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.failures import refused_line
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.serving.connections import Connections
from stoker.accel.control.serving.host_ids import HostIds
from stoker.accel.control.serving.routing import MAX_NAME, REPLY_CACHE_PEERS, Asked, one_line
from stoker.accel.control.watchdog import Watchdog
from stoker.pipeline.unit_wire import unit_to_proto
from stoker.protos import stoker_pb2 as pb
from stoker.protos.leases import HOST_ID_IN_USE, REREGISTERED, UNREACHABLE, LeaseSigner

log = logging.getLogger("stoker.dispatcher")
MAX_QUERIED_UNITS = 64  # units one poison query may ask about (a process holds one per rank)


class WorkerHandlers:
    def __init__(self, dispatcher: Dispatcher, job: pb.JobSpec, run_id: str, metrics: ControlMetrics,
                 leases: LeaseSigner, keyed: bool, watchdog: Watchdog, host_ids: HostIds, connections: Connections,
                 fail: Callable[[str], None]) -> None:
        self.dispatcher = dispatcher
        self.job = job
        self.run_id = run_id
        self.metrics = metrics
        self.leases = leases
        self.keyed = keyed
        self.watchdog = watchdog
        self.host_ids = host_ids
        self.connections = connections
        self.fail = fail
        self.told_finished: set[str] = set()  # hosts that have heard "finished"
        self._unreachable: set[tuple[str, int]] = set()  # (host, rank) pairs reported as unable to reach the rank

    def on_register(self, asked: Asked) -> pb.ControlReply:
        d, register = self.dispatcher, asked.request.register
        taken = self.host_ids.taken(register.host_id, asked.peer)
        if taken:
            log.error("%s", taken)
            return pb.ControlReply(error=pb.Error(message=taken))
        d.liveness.heartbeat(register.host_id)
        if d.over:  # a daemon joins a job only while it runs (a job restarted later joins anew)
            return self._finished(register.host_id)
        log.info("host %s registered with %d processes", register.host_id, register.procs)
        # A daemon registers when it starts or after it left the job, its processes stopped: whatever
        # its worker ids still hold here (a restarted dispatcher's journal) is held by nobody.
        stale = d.release(register.host_id, None, REREGISTERED, key=asked.caller.name if self.keyed else None)
        if stale:
            log.warning("host %s registered again: its %d earlier leases go back to the queue", register.host_id,
                        stale)
        return pb.ControlReply(registered=pb.Registered(job=self.job, run_id=self.run_id))

    def on_heartbeat(self, asked: Asked) -> pb.ControlReply:
        d, beat = self.dispatcher, asked.request.heartbeat
        if self.host_ids.taken(beat.host_id, asked.peer):  # the second daemon's: it is not heard
            return pb.ControlReply(error=pb.Error(message=f"host id {beat.host_id} {HOST_ID_IN_USE}"))
        d.liveness.heartbeat(beat.host_id)
        if self._other_run(beat.job_id, beat.run_id):
            return self._other_job()
        self.watchdog.heard_host(beat.host_id, beat.activity)
        return self._finished(beat.host_id) if d.over else pb.ControlReply(ok=pb.Ok())

    def on_lease(self, asked: Asked) -> pb.ControlReply:
        d, lease = self.dispatcher, asked.request.lease
        self.connections.leases_as(asked.peer, lease.host_id, lease.worker_id)
        if self._other_run(lease.job_id, lease.run_id):
            return self._other_job()
        if d.over:
            return self._finished(lease.host_id, daemon=False)
        unit = d.lease(lease.host_id, lease.worker_id, asked.request.request_id, asked.caller.name, lease.holding)
        if unit is None:
            return pb.ControlReply(wait=pb.Wait(retry_after_s=0.2))
        token = self.leases.token(unit.unit_id, lease.host_id, lease.worker_id, asked.caller.name)
        leased = unit_to_proto(unit, token, d.liveness.endpoint(unit.rank) or "")
        for sample_id, why in d.poison.in_unit(unit).items():
            leased.skip.add(sample_id=sample_id, reason=why)
        return pb.ControlReply(unit=leased)

    def on_release(self, asked: Asked) -> pb.ControlReply:
        r = asked.request.release
        if self._other_run("", r.run_id):  # units of a run that is over: they mean nothing here
            return self._other_job()
        if r.reason == UNREACHABLE:
            self._report_unreachable(r.host_id, list(r.unit_ids))
        if r.HasField("crashed_sample"):
            self._sample_crashed(r)
        count = self.dispatcher.release(r.host_id, list(r.worker_ids) or None, r.reason or "released",
                                        list(r.unit_ids) or None, asked.caller.name if self.keyed else None)
        log.info("host %s released %d units (%s)", r.host_id, count, one_line(r.reason))
        return pb.ControlReply(ok=pb.Ok())

    def on_hung(self, asked: Asked) -> pb.ControlReply:
        """A worker process ran a transform past --transform-timeout on a sample (it cut the call short and
        skipped it), or its daemon found it stuck there and kills it. The sample is skipped from now on."""
        hung = asked.request.hung
        if self._other_run("", hung.run_id):
            return self._other_job()
        worker = one_line((hung.worker_id or hung.host_id)[:MAX_NAME])
        how = f"{worker}, {hung.seconds:.0f} s" + (", stuck in C code: killed" if hung.stuck else "")
        log.error("worker process %s ran its transform on sample %d of unit %d for %.0f s, past --transform-timeout"
                  "%s", worker, hung.sample_id, hung.unit_id, hung.seconds,
                  " without answering its time limit (stuck in C code): its daemon kills it" if hung.stuck else "")
        poison = self.dispatcher.poison
        if poison.hung(hung.sample_id, how, hung.seconds):
            self.metrics.poison_samples.inc()
            log.error("sample %d is skipped from now on: %s", hung.sample_id, poison.why(hung.sample_id))
        return pb.ControlReply(ok=pb.Ok())

    def on_poison(self, asked: Asked) -> pb.ControlReply:
        """A worker process that waited with units in hand: their samples that became poison meanwhile."""
        skips = pb.Skips()
        for unit_id in asked.request.poison.unit_ids[:MAX_QUERIED_UNITS]:
            unit = self.dispatcher.plan.unit(unit_id)
            for sample_id, why in (self.dispatcher.poison.in_unit(unit).items() if unit is not None else ()):
                skips.samples.add(sample_id=sample_id, reason=why)
        return pb.ControlReply(skips=skips)

    def on_refuse(self, asked: Asked) -> pb.ControlReply:
        """A worker cannot run the job as pinned: the job fails, with its line, everywhere it is watched."""
        refusal = asked.request.refuse
        if refusal.job_id and refusal.job_id != self.job.job_id:
            return self._other_job()
        self.metrics.refusals.inc()
        self.fail(refused_line(refusal.host_id[:MAX_NAME], one_line(refusal.reason[:1000])))
        return pb.ControlReply(ok=pb.Ok())

    def hosts_not_told(self) -> set[str]:
        """Live hosts whose daemon has not yet heard that the job is finished."""
        return set(self.dispatcher.liveness.live_hosts()) - self.told_finished

    def _report_unreachable(self, host_id: str, unit_ids: list[int]) -> None:
        """A host cannot reach a rank's data socket: say so here too (once per host and rank), where
        whoever runs the job looks, with the address."""
        for unit_id in unit_ids[:16]:
            unit = self.dispatcher.plan.unit(unit_id)
            if unit is None or (host_id, unit.rank) in self._unreachable:
                continue
            if len(self._unreachable) < REPLY_CACHE_PEERS:
                self._unreachable.add((host_id, unit.rank))
            log.error("host %s cannot reach rank %d's data socket at %s (its worker heard nothing from it for "
                      "10 s): that rank must listen on an address the worker hosts reach ($STOKER_HOST, "
                      "--data-bind / --advertise-host)", host_id[:MAX_NAME], unit.rank,
                      self.dispatcher.liveness.endpoint(unit.rank))

    def _sample_crashed(self, release: pb.Release) -> None:
        """A worker process died transforming a sample: the second time, the sample is skipped from then on."""
        sample_id = release.crashed_sample
        worker = one_line((release.worker_ids[0] if release.worker_ids else release.host_id)[:MAX_NAME])
        how = f"{worker}, {one_line(release.reason[:100])}"
        log.error("worker process %s died transforming sample %d", how, sample_id)
        if self.dispatcher.poison.crashed(sample_id, how):
            self.metrics.poison_samples.inc()
            log.error("sample %d is skipped from now on: %s", sample_id, self.dispatcher.poison.why(sample_id))

    def _other_run(self, job_id: str, run_id: str) -> bool:
        """The asker works for another job, or an earlier run of this one ("": not said, not checked)."""
        return bool(job_id and job_id != self.job.job_id) or bool(run_id and run_id != self.run_id)

    def _other_job(self) -> pb.ControlReply:
        return pb.ControlReply(other_job=pb.OtherJob(job_id=self.job.job_id, run_id=self.run_id))

    def _finished(self, host_id: str, daemon: bool = True) -> pb.ControlReply:
        """"finished"; the host counts as told when its daemon (register, heartbeat) heard it: the daemon is
        what leaves (--once) and stops its processes, and a process asking for a lease is not the daemon."""
        if daemon:
            self.told_finished.add(host_id)
        return pb.ControlReply(finished=pb.Finished(job_id=self.job.job_id))
