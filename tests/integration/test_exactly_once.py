"""End to end with real processes and sockets: two `stoker worker` daemons, one consumer.

The consumer runs in the test process (so its summary and /metrics can be checked while it
is still up); the worker daemons are real subprocesses talking ZeroMQ over loopback TCP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.cost import cores_text
from stoker.accel.stepping import given
from stoker.pipeline.job import JobConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.endpoints import PortInUseError
from tests.helpers import Daemon, assert_exactly_once, consumer_for, free_port, scrape, wait_for


def test_two_hosts_deliver_every_sample_exactly_once_and_metrics_agree(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=2, accel=SimulatedAccelerator(rate=400))
    job = run_job(consumer)
    seen_during = []
    while job.thread.is_alive():
        seen_during.append(scrape(consumer.metrics_port)["stoker_consumer_samples_total"])
        job.thread.join(0.2)  # a reading every 0.2 s, and none after the job ends
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert summary.duplicates_dropped == 0 and summary.frames_dropped == {}
    metrics = scrape(consumer.metrics_port)
    assert metrics["stoker_consumer_samples_total"] == summary.samples
    assert any(0 < v < summary.samples for v in seen_during), seen_during  # scraped mid-run
    assert metrics["stoker_dispatcher_units{state=done}"] == consumer.dispatcher.total_units
    stages = summary.stage_seconds
    assert set(stages) == {"read", "decode", "augment", "send", "cpu", "wait_for_credit", "read_wait", "cpu_wait",
                           "throttled_wait", "receive", "copy", "step", "stall"}
    assert stages["decode"] > 0 and stages["step"] > 0
    # the workers' whole CPU covers their stages (and what lies between them: leasing, polling, sockets)
    assert stages["read"] + stages["decode"] + stages["augment"] + stages["send"] <= stages["cpu"]
    assert summary.per_core_rate == pytest.approx(summary.rows / stages["cpu"])


def test_worker_metrics_aggregate_their_processes(manifest, run_job, log_dir):
    """The daemon's one /metrics counts every process it runs. A process counts once it has started
    (its imports take a second or more on a busy machine, so the first batch may come from the other
    one alone): the job runs long enough (5 epochs at 100 images/s) for both to be seen."""
    consumer = consumer_for(manifest.uri, epochs=5, accel=SimulatedAccelerator(rate=100))
    job = run_job(consumer, hosts=1, procs=2)
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60), job.logs()
    daemon = job.daemons[0]
    assert wait_for(lambda: scrape(daemon.metrics_port)["stoker_worker_processes"] == 2, timeout=30), job.logs()
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 5)


def test_a_scrape_while_a_worker_process_starts_its_metrics_file_still_answers(tmp_path, monkeypatch):
    """A starting process creates its metrics file before it sizes it; a scrape in that instant
    used to fail whole (HTTP 500, prometheus/client_python#1199)."""
    from prometheus_client import Counter
    from prometheus_client.values import MultiProcessValue

    from stoker.workers.metrics import serve_multiprocess

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr("prometheus_client.metrics.values.ValueClass", MultiProcessValue(lambda: 4242))
    Counter("stoker_test_sent", "made by a running process", registry=None).inc(3)
    (tmp_path / "counter_999.db").touch()  # the new process, caught between open and truncate
    metrics = scrape(serve_multiprocess(0, "127.0.0.1"))
    assert metrics["stoker_test_sent_total"] == 3


def test_corrupt_jpeg_is_skipped_counted_and_reported(corrupt_manifest, run_job):
    manifest, victim = corrupt_manifest
    consumer = consumer_for(manifest.uri, epochs=2)
    job = run_job(consumer, hosts=1)
    assert wait_for(lambda: not job.thread.is_alive(), timeout=90)
    worker_metrics = scrape(job.daemons[0].metrics_port)  # the daemon waits for a drain before exiting
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 2, skipped_per_epoch=1)
    assert summary.skipped_samples == 2
    assert {s["key"] for s in summary.skipped} == {victim}
    assert {s["epoch"] for s in summary.skipped} == {0, 1}
    assert worker_metrics["stoker_worker_decode_errors_total"] == 2
    assert scrape(consumer.metrics_port)["stoker_consumer_samples_skipped_total"] == 2


def _garbage_sender(endpoint: str, job_id: str, stop: threading.Event) -> int:
    """Throw malformed and unauthorised messages at the data port; returns how many were sent."""
    ctx = zmq.Context()
    sent = 0
    try:
        stranger = ctx.socket(zmq.DEALER)
        stranger.connect(endpoint)
        greeted = ctx.socket(zmq.DEALER)
        greeted.connect(endpoint)
        greeted.send(pb.DataMessage(hello=pb.Hello(worker_id="mallory", job_id=job_id)).SerializeToString())
        greeted.poll(5000)
        bogus = pb.BatchHeader(job_id=job_id, epoch=0, unit_id=0, batch_index=0, sample_ids=[0, 1])
        bogus.frames.add(tensor="image", dtype="|u1", shape=[2, 224, 224, 3], nbytes=2 * 224 * 224 * 3)
        huge = pb.BatchHeader(job_id=job_id, sample_ids=[0])
        huge.frames.add(tensor="image", dtype="|u1", shape=[1 << 30, 1 << 30], nbytes=1 << 60)
        while not stop.is_set():
            stranger.send_multipart([b"\x00garbage\xff" * 10, b"more"])
            stranger.send_multipart([pb.DataMessage(batch=bogus).SerializeToString(), b"x" * 10])
            greeted.send_multipart([pb.DataMessage(batch=bogus).SerializeToString(), b"x" * 100])
            greeted.send_multipart([pb.DataMessage(batch=huge).SerializeToString(), b"x"])
            greeted.send_multipart([b"\x12\x34 not protobuf"])
            sent += 5
            stop.wait(0.05)
    finally:
        ctx.destroy(linger=0)
    return sent


def test_garbage_on_the_data_port_is_dropped_while_batches_flow(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=2, accel=SimulatedAccelerator(rate=500))
    stop = threading.Event()
    result = {}
    attacker = threading.Thread(target=lambda: result.update(sent=_garbage_sender(
        consumer.data_endpoint, consumer.job.job_id, stop)))
    consumer.start()
    attacker.start()
    job = run_job(consumer)
    summary = job.finish()
    stop.set()
    attacker.join()
    assert result["sent"] > 0
    assert_exactly_once(summary, manifest.num_samples, 2)
    dropped = summary.frames_dropped
    assert dropped.get("unknown_peer", 0) > 0 and dropped.get("bad_header", 0) > 0
    assert dropped.get("not_leaseholder", 0) > 0  # its hello proved no lease: it never got a sender slot
    # the consumer may still be reading what the attacker sent before it stopped: wait until the metric
    # and the receiver's count agree (a reading taken while neither moves)
    live = consumer.receiver.dropped
    assert wait_for(lambda: scrape(consumer.metrics_port)["stoker_consumer_frames_dropped_total{reason=unknown_peer}"]
                    == live["unknown_peer"], timeout=10), (live, scrape(consumer.metrics_port))
    assert live["unknown_peer"] >= dropped["unknown_peer"]


def test_killing_a_worker_process_mid_epoch_loses_nothing(manifest, run_job):
    consumer = consumer_for(manifest.uri, epochs=2, accel=SimulatedAccelerator(rate=150))
    job = run_job(consumer)
    daemon = job.daemons[0]
    assert wait_for(lambda: consumer.ledger.samples > 40 and daemon.children(), timeout=60), job.logs()
    victim = daemon.children()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: "restarted as" in daemon.output(), timeout=30), daemon.output()
    # the daemon outlived its process: its /metrics answers, and counts the restart (before it logs it)
    assert scrape(daemon.metrics_port)["stoker_worker_process_restarts_total"] == 1
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert f"pid {victim}) died" in daemon.output()


def test_workers_started_before_the_consumer_wait_and_then_deliver(manifest, run_job, log_dir):
    control_port, data_port = free_port(), free_port()
    early = [Daemon(f"tcp://127.0.0.1:{control_port}", f"early{i}", 1, log_dir) for i in range(2)]
    try:
        # nothing answers: each daemon keeps asking (and says so after 5 s) instead of giving up
        assert wait_for(lambda: all(d.unanswered() for d in early), timeout=30), early[0].output()
        assert all(d.proc.poll() is None for d in early)
        cfg = ConsumerConfig(data_bind=f"tcp://127.0.0.1:{data_port}",
                             control_bind=f"tcp://127.0.0.1:{control_port}", metrics_port=None)
        consumer = Consumer(cfg, JobConfig(manifest_uri=manifest.uri, epochs=1, batch_size=16, unit_batches=2))
        job = run_job(consumer, start_workers=False)
        job.daemons.extend(early)
        summary = job.finish()
        assert_exactly_once(summary, manifest.num_samples, 1)
    finally:
        for d in early:
            d.stop()


def test_port_in_use_is_a_clear_error(manifest):
    first = consumer_for(manifest.uri)
    first.start()
    try:
        port = first.data_endpoint.rsplit(":", 1)[1]
        second = Consumer(ConsumerConfig(data_bind=f"tcp://127.0.0.1:{port}", control_bind="tcp://127.0.0.1:0",
                                         metrics_port=None), JobConfig(manifest_uri=manifest.uri))
        with pytest.raises(PortInUseError, match="already in use"):
            second.start()
        result = subprocess.run([sys.executable, "-m", "stoker", "train", "--data", manifest.uri,
                                 "--data-bind", f"tcp://127.0.0.1:{port}", "--metrics-port", "-1"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert "already in use" in result.stderr and "Traceback" not in result.stderr
    finally:
        first.stop()


@pytest.mark.parametrize("flag", ["--control-bind", "--data-bind", "--metrics-port"])
def test_every_port_in_use_is_named_at_once_by_stoker_train(manifest, flag):
    """Another process holds the port (a second job on the same host, as users start them): `stoker
    train` exits 2 within seconds naming the port, for the control port too (an unclosed monitor
    socket used to hold the context's term(): it waited for ever, printing nothing)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        value = str(port) if flag == "--metrics-port" else f"tcp://127.0.0.1:{port}"
        flags = {"--control-bind": "tcp://127.0.0.1:0", "--data-bind": "tcp://127.0.0.1:0", "--metrics-port": "0"}
        flags[flag] = value
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "stoker", "train", "--data", manifest.uri,
                                 *(x for kv in flags.items() for x in kv)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(port) in result.stderr and "in use" in result.stderr and "Traceback" not in result.stderr
    assert "never awaited" not in result.stderr  # the coroutines made before the bind failed are closed
    assert time.monotonic() - started < 30


def test_a_control_port_in_use_is_named_at_once_by_stoker_dispatch(manifest, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "stoker", "dispatch", "--data", manifest.uri, "--metrics-port",
                                 "-1", "--control-bind", f"tcp://127.0.0.1:{port}", "--job-secret",
                                 str(tmp_path / "secret")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and f"127.0.0.1:{port} is already in use" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and time.monotonic() - started < 30


def test_sigterm_drains_a_worker_daemon(manifest, run_job, log_dir):
    consumer = consumer_for(manifest.uri, epochs=3, accel=SimulatedAccelerator(rate=100))
    job = run_job(consumer, hosts=2)
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60)
    leaving = job.daemons.pop(0)
    started = time.monotonic()
    assert leaving.stop(timeout=20) == 0
    assert time.monotonic() - started < 15
    assert "drained" in leaving.output()
    summary = job.finish(timeout=180)  # the remaining host finishes the job, redoing what was handed back
    assert_exactly_once(summary, manifest.num_samples, 3)


def test_stoker_run_cli_writes_the_summary(manifest, tmp_path):
    out = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--epochs", "2",
                             "--batch-size", "16", "--json", str(out), "--no-progress", "--scale", "0.04",
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "0", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    for key in ("samples", "unique_samples", "duplicates_dropped", "epochs", "elapsed_s", "delivered_samples_per_s",
                "stall_fraction", "hosts", "procs_per_host", "stage_seconds"):
        assert key in summary
    assert summary["samples"] == summary["unique_samples"] == 2 * manifest.num_samples
    # two hosts run; both usually deliver, but one may make every unit before the other leases one
    assert summary["duplicates_dropped"] == 0 and summary["hosts"] in (1, 2)
    assert np.isfinite(summary["delivered_samples_per_s"]) and summary["delivered_samples_per_s"] > 0
    # the default device (an A100) computes at 4% (100 img/s), which two worker processes outrun even on a
    # loaded 2-core machine (at the default 10% = 250 img/s a busy CI machine can leave the device waiting > 5%)
    assert 80 < summary["rows_per_s"] <= 104 and summary["bottleneck"] == "compute"
    assert 0 < summary["cores_in_use"] < 1 and summary["cpu_wait_fraction"] is not None  # schedstat here
    cores = summary["cores"]  # the one answer: a full-size a100 over this run's rows per CPU-second
    assert (cores["transform"], cores["accelerator"], cores["accelerator_rate"]) == ("train", "a full-size a100", 2500)
    assert cores["per_core_rate"] == summary["per_core_rate"] and 100 < cores["per_core_rate"]
    assert cores["cores_needed"] == pytest.approx(2500 / cores["per_core_rate"])
    # the top-level figure is the same answer for this run's device (an A100 at 4%): one figure, scaled
    assert summary["cores_needed"] == pytest.approx(0.04 * cores["cores_needed"])
    low, high = cores["per_core_spread"]
    assert low <= cores["per_core_rate"] <= high
    lines = result.stdout.strip().splitlines()
    assert lines[-4].startswith("bottleneck: compute") and lines[-3].startswith("worker CPU: ")
    assert [line for line in lines if "cores needed" in line] == [lines[-2]]  # one figure for the question
    assert lines[-2] == (f"host cores needed for a full-size a100: {cores_text(cores['cores_needed'])} (2,500 images/s "
                         f"over {cores['per_core_rate']:,.0f} images per CPU-second (10-90% of the run: {low:,.0f}-"
                         f"{high:,.0f}); transform train)")


def test_stoker_run_on_the_null_device_says_its_stall_is_the_ceiling(manifest):
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--accel", "null",
                             "--no-progress", "--data-bind", "tcp://127.0.0.1:0", "--control-bind",
                             "tcp://127.0.0.1:0", "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "device: null (it never computes" in result.stdout and "a full-size" not in result.stdout


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _windows_full(receiver, senders: int) -> bool:
    """`senders` senders, each with its whole credit window of batches at the rank (held or queued, none owed)."""
    try:
        peers = list(receiver.credit.senders.values())
    except RuntimeError:  # a sender came or went while we read: not settled
        return False
    return len(peers) == senders and all(p.in_hand - p.outstanding >= receiver.window for p in peers)


def test_oversupplied_workers_wait_for_credit_and_memory_stays_flat(manifest, run_job):
    """4 worker processes (~2,000 img/s of capacity here) feed a consumer that takes 60 img/s."""
    consumer = consumer_for(manifest.uri, epochs=5, accel=SimulatedAccelerator(rate=60))
    job = run_job(consumer, hosts=2, procs=2)
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60), job.logs()
    # memory is measured from when the rank holds all it ever will: every sender's whole credit window here
    assert wait_for(lambda: _windows_full(consumer.receiver, senders=4), timeout=30), job.logs()
    pids = [os.getpid()] + [p for d in job.daemons for p in d.children()]
    samples = []
    while job.thread.is_alive() and len(samples) < 12:
        samples.append([_rss_mb(p) for p in pids])
        job.thread.join(0.5)  # a reading every 0.5 s while the job runs
    credit_wait = sum(scrape(d.metrics_port).get("stoker_worker_credit_wait_seconds_total", 0) for d in job.daemons)
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 5)
    first, last = samples[1], samples[-1]
    growth = [b - a for a, b in zip(first, last, strict=True)]
    assert max(growth) < 25, f"RSS grew by {growth} MB while the workers were ahead"
    assert credit_wait > 5, "workers this far ahead must spend their time waiting for credit"


def test_a_rank_holds_no_more_batches_than_its_byte_budget_however_many_senders(manifest, run_job):
    """9 worker processes with a credit window of 3 could hold 27 batches at the rank; its byte
    budget allows 6 (and one more of the unit the step waits for). Batches sent (scraped from the
    daemons) less batches stepped (read before and after the scrape) never exceed it, and the job still delivers every
    sample once: a tight budget slows the workers, it does not deadlock them."""
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None,
                         credit_window=3, credit_budget_mb=1e-4)  # under 6 batches: the floor, 2 x window
    job_cfg = JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=8, unit_batches=2, image_size=32)
    consumer = Consumer(cfg, job_cfg, given(SimulatedAccelerator(rate=160)))
    job = run_job(consumer, hosts=3, procs=3)
    assert consumer.receiver.credit.budget == 6
    assert wait_for(lambda: consumer.ledger.samples > 0, timeout=60), job.logs()
    most, senders = 0, 0
    while job.thread.is_alive() and consumer.ledger.samples < 2 * manifest.num_samples - 40:
        stepped = consumer.progress.batches
        sent = sum(scrape(d.metrics_port).get("stoker_worker_batches_total", 0) for d in job.daemons)
        if consumer.progress.batches == stepped:  # no step ended during the scrape: an exact reading
            most = max(most, sent - stepped)
        senders = max(senders, len(consumer.receiver.peers))
        job.thread.join(0.05)  # a reading every 0.05 s while the job runs
    summary = job.finish()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert senders > 2, "the test needs more senders than the budget has windows"
    # the budget, and one batch of the unit the step waits for when early batches fill the budget
    assert 3 <= most <= 6 + 1, f"the rank held {most} batches; its budget is 6"
