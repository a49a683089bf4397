"""Daemons and their processes across restarts and deaths: rejoining a job, dying with a parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from stoker.accel import checkpoint
from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.pipeline.job import JobConfig
from tests.helpers import Daemon, RecordingAccelerator, free_port, wait_for


class Crash(Exception):
    pass


def test_a_consumer_restarted_after_the_daemons_left_gets_them_back(manifest, log_dir, tmp_path):
    """The daemons leave the job after 2 s of silence; the consumer comes back from its checkpoint once
    they have asked to register again for 5 s unanswered, and they rejoin the same job: the epoch
    completes exactly once."""
    cfg = ConsumerConfig(data_bind=f"tcp://127.0.0.1:{free_port()}", control_bind=f"tcp://127.0.0.1:{free_port()}",
                         metrics_port=None, host_timeout_s=3.0)
    job = JobConfig(manifest_uri=manifest.uri, epochs=1, batch_size=16, unit_batches=2)
    before = RecordingAccelerator(rate=200)
    first = Consumer(cfg, job, given(before))
    first.start()
    daemons = [Daemon(first.control_endpoint, f"host{i}", 1, log_dir, extra=("--leave-after", "2"))
               for i in range(2)]

    def step_then_maybe_die(consumer: Consumer) -> None:
        if len(before.samples()) >= 0.4 * manifest.num_samples:
            checkpoint.save(consumer.state_dict(), tmp_path / "data.json")
            raise Crash

    try:
        with pytest.raises(Crash):
            first.run(on_step=step_then_maybe_die)
    finally:
        first.stop()
    assert wait_for(lambda: all("leaving job" in d.output() for d in daemons), timeout=30), daemons[0].output()
    assert wait_for(lambda: all(d.unanswered() for d in daemons), timeout=30), daemons[0].output()
    state = checkpoint.load(tmp_path / "data.json")
    after = RecordingAccelerator(rate=200)
    second = Consumer(cfg, job, given(after), resume=state)
    rejoined = lambda: all(d.output().count(f"joined job {first.job.job_id}") == 2 for d in daemons)  # noqa: E731

    def first_step_waits_for_both(consumer: Consumer) -> None:
        # One daemon's client may be up to its 2 s back-off behind the other: without this wait the
        # first could finish the job alone, and the second would never hear of it.
        if len(after.stepped) == 1:
            assert wait_for(rejoined, timeout=30), "\n".join(d.output()[-2000:] for d in daemons)

    try:
        summary = second.run(on_step=first_step_waits_for_both)
        codes = [d.wait(timeout=30) for d in daemons]
    finally:
        second.stop()
        for d in daemons:
            d.stop()
    assert codes == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
    everything = np.concatenate([before.samples(), after.samples()])
    assert sorted(everything.tolist()) == list(range(manifest.num_samples))  # once each, across the restart
    assert summary.samples == len(after.samples())


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    return False
        except FileNotFoundError:
            continue
    return True


def test_decode_processes_die_with_their_daemon(manifest, log_dir):
    consumer = Consumer(ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0",
                                       metrics_port=None),
                        JobConfig(manifest_uri=manifest.uri, epochs=50, batch_size=16),
                        given(SimulatedAccelerator(rate=50)))
    consumer.start()
    daemon = Daemon(consumer.control_endpoint, "h0", 2, log_dir)
    try:
        assert wait_for(lambda: len(daemon.children()) == 2, timeout=30), daemon.output()
        children = daemon.children()
        daemon.proc.send_signal(signal.SIGKILL)  # only the daemon: no chance to drain
        daemon.proc.wait(10)
        assert wait_for(lambda: _gone(children), timeout=10), f"decode processes {children} outlived their daemon"
    finally:
        daemon.stop()
        consumer.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_worker_daemons_die_with_their_stoker_run(manifest, tmp_path):
    """kill -9 `stoker run`: its daemons and their processes go too, and free their metrics ports."""
    port = free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.Popen([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--epochs", "50",
                            "--accel", "simulated", "--rate", "50", "--no-progress", "--metrics-port", "-1",
                            "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                            "--worker-metrics-port", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: not _port_free(port) and not _port_free(port + 1), timeout=60)
        daemons = _children(run.pid)
        assert len(daemons) == 2 and wait_for(lambda: all(_children(d) for d in daemons), timeout=30)
        family = daemons + [c for d in daemons for c in _children(d)]  # each with its decode process
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert wait_for(lambda: _gone(family), timeout=10), "daemons outlived stoker run"
        assert _port_free(port) and _port_free(port + 1)
        assert not list(tmp_path.glob("stoker-worker-metrics-*"))  # each daemon removed its metrics folder
    finally:
        if run.poll() is None:
            run.kill()


def test_once_daemons_leave_as_soon_as_stoker_train_finishes(manifest, log_dir, tmp_path):
    control = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    train = subprocess.Popen([sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--batch-size", "16",
                              "--no-progress", "--metrics-port", "-1", "--data-bind", "tcp://127.0.0.1:0",
                              "--control-bind", control], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    daemon = Daemon(control, "h0", 1, log_dir, env=env)
    try:
        assert train.wait(120) == 0
        ended = time.monotonic()
        assert daemon.wait(timeout=30) == 0, daemon.output()
        assert time.monotonic() - ended < 5, "the daemon did not hear that the job finished"
        assert not list(tmp_path.glob("stoker-worker-metrics-*"))
    finally:
        daemon.stop()
        if train.poll() is None:
            train.kill()


def test_a_once_daemon_serves_one_job_and_leaves_when_another_takes_its_port(manifest, log_dir, tmp_path):
    """A time-boxed job ends without "finished"; the next job on the same control port is another job, which a
    --once daemon (stoker run's, a Loader's) must not serve: it exits instead of registering for it."""
    control = f"tcp://127.0.0.1:{free_port()}"

    def train() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--batch-size", "16",
                                 "--epochs", "1000", "--max-seconds", "3", "--no-progress", "--metrics-port", "-1",
                                 "--data-bind", "tcp://127.0.0.1:0", "--control-bind", control],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    first = train()
    daemon = Daemon(control, "h0", 1, log_dir)  # --once
    second = None
    try:
        assert first.wait(120) == 0
        second = train()
        assert daemon.wait(timeout=30) == 0, daemon.output()
        assert "--once: exiting" in daemon.output() and "joined job" in daemon.output()
        assert daemon.output().count("joined job") == 1, daemon.output()  # the first job only
    finally:
        daemon.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _fake_dispatcher(endpoint: str, job, stop) -> None:
    """Answers a daemon like a dispatcher would, with a job its processes cannot start on."""
    import zmq

    from stoker.protos import stoker_pb2 as pb

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    try:
        while not stop.is_set():
            if not sock.poll(100):
                continue
            peer, payload = sock.recv_multipart()
            request = pb.ControlRequest()
            request.ParseFromString(payload)
            kind = request.WhichOneof("kind")
            reply = pb.ControlReply(request_id=request.request_id)
            if kind == "register":
                reply.registered.job.CopyFrom(job)
            elif kind == "lease":  # a unit to send to a data endpoint that cannot be: the process dies
                reply.unit.CopyFrom(pb.WorkUnit(unit_id=0, epoch=0, data_endpoint="not an endpoint",
                                                segments=[pb.Segment(shard_index=0, start=0, stop=4)]))
            else:
                reply.ok.SetInParent()
            sock.send_multipart([peer, reply.SerializeToString()])
    finally:
        ctx.destroy(linger=0)


def test_a_process_that_crashes_at_start_up_is_restarted_with_back_off(manifest, log_dir):
    import threading

    from stoker.protos import stoker_pb2 as pb

    control = f"tcp://127.0.0.1:{free_port()}"
    job = pb.JobSpec(job_id="crashy", manifest_uri=manifest.uri, batch_size=16,
                     image_size=64, transform="train", min_area=0.05, max_area=1.0, heartbeat_s=0.5,
                     dataset="imagenet")
    stop = threading.Event()
    server = threading.Thread(target=_fake_dispatcher, args=(control, job, stop), daemon=True)
    server.start()
    daemon = Daemon(control, "h0", 1, log_dir, once=False)
    try:
        assert wait_for(lambda: "crashed 4 time(s) in a row; restarting it in 2.0 s" in daemon.output(), timeout=40), \
            daemon.output()[-3000:]
        time.sleep(1.0)  # letting half the back-off pass is the test: no fifth start comes in it
        assert daemon.output().count("died (exit code") == 4
    finally:
        daemon.stop()
        stop.set()


def test_a_second_daemon_with_a_live_host_id_is_refused_and_the_job_goes_on(manifest, log_dir, run_job):
    """Two daemons started with one --host-id (a copied unit file): the second is refused with the
    reason and exits 1, the first serves the job exactly once (they used to take each other's leases
    back and stall the job, with the dispatcher blaming the network). A daemon that restarts after
    its predecessor died is let in (the predecessor falls silent)."""
    from tests.helpers import assert_exactly_once, consumer_for

    consumer = consumer_for(manifest.uri, epochs=2, accel=SimulatedAccelerator(rate=20))  # 16 s: outlives the twin
    job = run_job(consumer, hosts=1)
    assert wait_for(lambda: "joined job" in job.daemons[0].output(), timeout=60), job.logs()
    (log_dir / "twin").mkdir()
    twin = Daemon(consumer.control_endpoint, "host0", 1, log_dir / "twin")
    assert twin.wait(timeout=30) == 1, twin.output()
    assert "host id host0 is in use by a live daemon" in twin.output() and "joined job" not in twin.output()
    assert_exactly_once(job.finish(), manifest.num_samples, 2)


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_frozen_worker_process_on_a_live_host_has_its_unit_leased_again_at_the_default_timeouts(
        manifest, log_dir, run_job, caplog, hosts):
    """A decode process SIGSTOPped while it holds a unit (its daemon heartbeats on, so its host is
    alive): its daemon sees it stopped and kills it after 5 s, its units are re-leased as its connection
    closes, it restarts, and the job finishes exactly once, also when it was the fleet's only process
    (the unit used to wait for the 600 s lease timeout; then for the rank's 30 s --sender-timeout, and
    for ever with one process)."""
    from tests.helpers import assert_exactly_once, consumer_for

    caplog.set_level("INFO")
    consumer = consumer_for(manifest.uri, epochs=3, accel=SimulatedAccelerator(rate=100), batch_size=8,
                            unit_batches=4)  # 15 units of 4 batches
    job = run_job(consumer, hosts=hosts)
    assert wait_for(lambda: consumer.ledger.samples >= 32, timeout=60), job.logs()

    def in_the_middle_of_a_unit() -> bool:  # host0's process has begun a unit whose last batch is not here
        receiver = consumer.receiver
        peers = [(peer, receiver.credit.senders.get(peer_id)) for peer_id, peer in list(receiver.peers.items())]
        return any(p.host_id == "host0" and c is not None and c.unit >= 0 and not c.unit_complete for p, c in peers)

    assert wait_for(in_the_middle_of_a_unit, timeout=30, interval=0.001), job.logs()
    frozen = job.daemons[0].children()[0]
    os.kill(frozen, signal.SIGSTOP)
    started = time.monotonic()
    try:
        assert wait_for(lambda: "for 5 s while holding its units; killing it" in job.daemons[0].output(),
                        timeout=30), job.logs()
        assert time.monotonic() - started < 12
    finally:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert_exactly_once(job.finish(timeout=60), manifest.num_samples, 3)


PIDS_ROOT = "/sys/fs/cgroup/pids"  # cgroup v1's pids hierarchy (this machine's); v2 hosts skip with the reason


def _pids_cgroup(name: str, limit: int) -> str:
    folder = os.path.join(PIDS_ROOT, name)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "pids.max"), "w") as f:
            f.write(str(limit))
    except OSError as exc:
        pytest.skip(f"needs root and a writable cgroup v1 pids hierarchy at {PIDS_ROOT}: {exc}")
    return folder


def test_a_host_out_of_processes_says_so_once_naming_the_limit_and_the_job_loses_nothing(manifest, log_dir):
    """8 processes asked (the most allowed here) in a pids cgroup of 25, as a container's --pids-limit gives:
    the daemon runs the processes that fit, says once which limit it met and what to change, and retries with
    back-off; no tracebacks, no process aborting inside zmq, no message dropped, every sample once, and the
    daemon exits 0 (it used to die of "[Errno 11] Resource temporarily unavailable", after 9-22 process deaths
    and a dropped message)."""
    folder = _pids_cgroup(f"stoker-test-{os.getpid()}", 25)
    recorder = RecordingAccelerator(rate=5000)
    cfg = ConsumerConfig(data_bind=f"tcp://127.0.0.1:{free_port()}", control_bind=f"tcp://127.0.0.1:{free_port()}",
                         metrics_port=0)
    consumer = Consumer(cfg, JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, unit_batches=2, seed=3),
                        given(recorder))
    consumer.start()
    log_path = log_dir / "h0.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", "--dispatcher",
                                   consumer.control_endpoint, "--procs", "8", "--host-id", "h0", "--metrics-port",
                                   "-1", "--once"], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: open(os.path.join(folder, "cgroup.procs"), "w").write(
                                      str(os.getpid())))
    try:
        summary = consumer.run()
    finally:
        consumer.stop()
        try:
            daemon.wait(timeout=30)
        finally:
            daemon.kill()
    out = log_path.read_text()
    assert daemon.returncode == 0, out[-3000:]
    assert summary.unique_samples == summary.samples == 2 * manifest.num_samples and summary.skipped_samples == 0
    assert summary.frames_dropped == {}, summary.frames_dropped
    assert "Traceback" not in out and "Resource temporarily unavailable (src/thread.cpp" not in out, out[-3000:]
    assert out.count("this host's pids limit is reached") == 1, out[-3000:]
    assert f"in cgroup {folder}): raise pids.max" in out and "died (" not in out
