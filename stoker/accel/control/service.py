"""`stoker dispatch`: the dispatcher as its own process, with a journal to survive restarts.

By default the dispatcher lives inside the consumer. Run on its own, it owns the epoch plan
and the control socket; workers register and lease here, the consumer attaches and acks
here (`stoker train --dispatcher ...`), and every lease, ack and release goes to the
journal before it is answered. Restarted with the same journal it carries on: done units
stay done, open leases stay with their hosts for one host timeout, and lease tokens stay
valid (the journal keeps the key they are signed with).

Without CURVE keys the consumer proves itself with the job secret (`--job-secret FILE`, made
on first start, mode 0600, or $STOKER_JOB_SECRET); workers never see it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from stoker.accel.control.dispatch_config import DispatchConfig
from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.fleet_member import FleetMembership, join_fleet
from stoker.accel.control.journal import Journal
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.serving.control_socket import run_service, serving
from stoker.accel.control.serving.server import AccessPolicy, ControlServer, serve_control
from stoker.accel.control.watchdog import StallBounds
from stoker.pipeline.job import JobConfig
from stoker.pipeline.job_wire import job_identity, job_to_proto
from stoker.pipeline.store.shards import Manifest
from stoker.protos import job_secret
from stoker.protos.aio import run_until_one_fails
from stoker.protos.curve import ServerKeys
from stoker.protos.endpoints import advertised, serves
from stoker.protos.exposure import check_exposure
from stoker.protos.leases import KEY_BYTES, LeaseSigner

log = logging.getLogger("stoker.dispatcher")


class DispatchService:
    def __init__(self, cfg: DispatchConfig, job: JobConfig) -> None:
        check_exposure({"control_bind": cfg.control_bind, "metrics_addr": cfg.metrics_addr}, bool(cfg.keys),
                       cfg.insecure, risk="lease the job's units, attach as a consumer or read its metrics")
        job = job.pin()  # the version of its transform every worker must run, imported here
        self.journal = Journal(cfg.journal, job_identity(job), os.urandom(KEY_BYTES)) if cfg.journal else None
        if self.journal and self.journal.replayed:  # the same job, under the id its peers know
            job = replace(job, job_id=self.journal.replayed.job["job_id"])
        self.cfg = cfg
        self.job = job
        self.leases = LeaseSigner(self.journal.lease_key, job.job_id) if self.journal else LeaseSigner.new(job.job_id)
        self.secret_file = None if cfg.keys or os.environ.get(job_secret.ENV) else cfg.secret_path()
        self.consumer_secret = None if cfg.keys else (
            os.environ[job_secret.ENV].strip().encode() if self.secret_file is None
            else job_secret.load_or_create(self.secret_file))
        manifest = Manifest.load(job.manifest_uri)
        job.check_fits(manifest)
        manifest.check_shard_files()
        self.metrics = ControlMetrics()
        if self.journal and self.journal.replayed:
            replayed = self.journal.replayed
            log.info("continuing from %s: %d units done, %d leases open", cfg.journal,
                     replayed.done_below + len(replayed.done), len(replayed.leases))
        self.dispatcher = Dispatcher(job.plan(manifest), cfg.host_timeout_s, cfg.lease_timeout_s,
                                     journal=self.journal,
                                     on_release=lambda reason, n: self.metrics.releases.labels(reason=reason).inc(n),
                                     planned_batches=job.planned_batches if job.kind.one_row_per_sample else None)
        self.keys = ServerKeys.load(cfg.keys) if cfg.keys else None
        self.stall = StallBounds(cfg.stall_report_s, cfg.stall_timeout_s)  # a bad pair fails here, at start
        self.endpoint = ""  # once bound: where workers and consumers connect (a free port's number, not 0)
        self.metrics_port: int | None = None  # once served: the /metrics port taken (a free one for 0)
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self, on_ready: Callable[[DispatchService], None] | None = None) -> None:
        """Serve until the job is finished (plus `linger_s`) or SIGTERM/SIGINT; `on_ready` is called once
        the sockets are bound, when `endpoint` and `metrics_port` say what port 0 turned into."""
        if serves(self.cfg.metrics_port):
            self.metrics_port = self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_addr)
        gc.freeze()  # the manifest and the plan live as long as the process: keep them out of full collections
        try:
            run_service(lambda: self._serve(on_ready))
        finally:
            if self.journal:
                self.journal.close()

    async def _serve(self, on_ready: Callable[[DispatchService], None] | None) -> None:
        async with serving(self.keys, self.cfg.control_bind, self.stop) as (control, monitor, bound):
            self.endpoint = advertised(bound, self.cfg.advertise_host)
            access = AccessPolicy(keyed=self.keys is not None, consumer_secret=self.consumer_secret,
                                  remote_consumers=True)
            server = ControlServer(control, self.dispatcher, job_to_proto(self.job), self.metrics,
                                   self.leases, access, self.stall)
            server.update_gauges()
            fleet = self._join_fleet(server)
            self.ready.set()
            if on_ready is not None:
                on_ready(self)
            try:
                await run_until_one_fails([*serve_control(control, monitor, server, self.stop), self._until_done()],
                                          self.stop)
            finally:
                if fleet is not None:
                    await asyncio.get_running_loop().run_in_executor(None, fleet.leave)

    def _join_fleet(self, server: ControlServer) -> FleetMembership | None:
        """With --fleet: register the job (no fleet answering fails it here, naming the address) and beat
        what its ranks measure (their acks say it)."""
        cfg = self.cfg
        membership = join_fleet(cfg.seat, self.job, self.endpoint, server.job_need, cfg.keys)
        if membership is not None:
            membership.join()
            membership.start()
        return membership

    async def _until_done(self) -> None:
        while not self.stop.is_set() and not self.dispatcher.over:
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + self.cfg.linger_s  # workers and the consumer hear "finished"
        while not self.stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        self.stop.set()
