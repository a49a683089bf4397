"""stoker/workers/daemon.py, its registration: a --once daemon that left its job and hears, when it registers
again, that this very job is finished exits instead of waiting for ever; any other daemon, or one told
of another job's end, keeps waiting for a job to join."""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from prometheus_client import CollectorRegistry

from stoker.protos import stoker_pb2 as pb
from stoker.workers import daemon as daemon_module
from stoker.workers.daemon import WorkerDaemon
from stoker.workers.metrics import WorkerMetrics
from stoker.workers.worker_config import WorkerConfig
from tests.helpers import free_port


@pytest.fixture
def finished_dispatcher():
    """A ROUTER that answers every registration with "finished" for job `over`, counting them."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router.bind(endpoint)
    stop, registrations = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            if router.poll(20):
                peer, data = router.recv_multipart()
                request = pb.ControlRequest.FromString(data)
                registrations.append(request.register.host_id)
                reply = pb.ControlReply(request_id=request.request_id, finished=pb.Finished(job_id="over"))
                router.send_multipart([peer, reply.SerializeToString()])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield endpoint, registrations
    stop.set()
    thread.join()
    router.close(0)
    ctx.term()


def _daemon(monkeypatch, endpoint: str, once: bool, left_job: str) -> WorkerDaemon:
    monkeypatch.setattr(daemon_module, "WorkerMetrics", lambda: WorkerMetrics(CollectorRegistry()))
    daemon = WorkerDaemon(WorkerConfig(connect=endpoint, host_id="host0", metrics_port=None, once=once))
    daemon._job_id = left_job  # the job it served and left when its dispatcher went silent
    return daemon


def _register_for(daemon: WorkerDaemon, seconds: float) -> tuple[object, float]:
    """Register; stop the daemon after `seconds` if it is still waiting. Returns (job, seconds taken)."""
    timer = threading.Timer(seconds, lambda: setattr(daemon, "stopping", True))
    timer.start()
    started = time.monotonic()
    try:
        return daemon._register(), time.monotonic() - started
    finally:
        timer.cancel()
        daemon.client.close()
        daemon.ctx.term()


def test_a_once_daemon_told_its_own_job_is_finished_stops_waiting(monkeypatch, finished_dispatcher):
    endpoint, registrations = finished_dispatcher
    daemon = _daemon(monkeypatch, endpoint, once=True, left_job="over")
    job, took = _register_for(daemon, seconds=10)
    assert job is None and not daemon.stopping and took < 5  # it gave up on its own, at the first answer
    assert registrations == ["host0"]


@pytest.mark.parametrize("once, left_job", [(False, "over"), (True, "another"), (True, "")],
                         ids=["no-once", "once-other-job", "once-never-joined"])
def test_other_daemons_told_a_job_is_finished_keep_waiting_for_one(monkeypatch, finished_dispatcher, once,
                                                                   left_job):
    endpoint, registrations = finished_dispatcher
    daemon = _daemon(monkeypatch, endpoint, once=once, left_job=left_job)
    job, took = _register_for(daemon, seconds=2.5)
    assert job is None and daemon.stopping and took >= 2.5  # still registering when it was stopped
    assert len(registrations) >= 2  # asked again (once a second) rather than leaving
