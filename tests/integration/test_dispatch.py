"""The dispatcher as its own process: killed mid-epoch and restarted from its journal."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.control.journal import replay
from stoker.accel.control.remote import NotAConsumer, attach
from stoker.accel.stepping import given
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys, add_key, init_keys
from tests.helpers import Daemon, assert_exactly_once, free_port, wait_for
from tests.journal_crash import KINDS
from tests.strangers import call, dealer

ROOT = Path(__file__).resolve().parents[2]


def _dispatcher(manifest_uri: str, control: str, data: str, journal, log_path,
                extra: tuple[str, ...] = (), crash: tuple[int, str] | None = None,
                host_timeout: tuple[str, ...] = ("--host-timeout", "3")) -> subprocess.Popen:
    """`stoker dispatch`; with `crash` = (n, kind) it SIGKILLs itself at its n-th journal write point
    of that kind (tests/journal_crash.py). `host_timeout=()`: the default."""
    launcher = ["tests.journal_crash", str(crash[0]), crash[1], "--"] if crash else ["stoker"]
    cmd = [sys.executable, "-m", *launcher, "--log-level", "INFO", "dispatch", "--data", manifest_uri,
           "--journal", str(journal), "--control-bind", control, "--metrics-port", "-1",
           *host_timeout, "--epochs", "2", "--batch-size", "16", "--unit-batches", "2",
           "--job-secret", f"{journal}.key", *extra]
    return subprocess.Popen(cmd, stdout=open(log_path, "a"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"})


def _attached_job(control: str, data: str, secret, log_dir, rate: float):
    """A consumer attached to the dispatcher at `control` and running in a thread, with 2 worker
    daemons: (consumer, daemons, runner thread, the dict its summary lands in)."""
    assert wait_for(secret.exists, timeout=30)
    consumer = Consumer(ConsumerConfig(data_bind=data, dispatcher=control, metrics_port=None, job_secret=str(secret)),
                        None, given(SimulatedAccelerator(rate=rate)))
    consumer.start()
    daemons = [Daemon(control, f"host{i}", 1, log_dir) for i in range(2)]
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(summary=consumer.run()), daemon=True)
    runner.start()
    return consumer, daemons, runner, result


def test_a_dispatcher_killed_inside_a_journal_write_and_again_inside_a_compaction_delivers_every_sample_once(
        manifest, log_dir):
    """The dispatcher dies (SIGKILL) halfway through writing its 4th journal line, is restarted,
    dies again just before the rename of a compaction, and is restarted again: the job finishes
    with every sample once per epoch, the torn line cut off, a second dispatcher on the journal refused."""
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal, log = log_dir / "dispatch.journal", log_dir / "dispatch.log"
    secret = log_dir / "dispatch.journal.key"
    runs = [_dispatcher(manifest.uri, control, data, journal, log, crash=(3, KINDS[0]))]
    consumer, daemons, runner, result = _attached_job(control, data, secret, log_dir, rate=500)
    try:
        assert runs[0].wait(60) == -signal.SIGKILL, log.read_text()[-3000:]
        runs.append(_dispatcher(manifest.uri, control, data, journal, log, crash=(0, KINDS[3])))
        assert runs[1].wait(90) == -signal.SIGKILL, log.read_text()[-3000:]
        runs.append(_dispatcher(manifest.uri, control, data, journal, log))
        assert wait_for(lambda: log.read_text().count("continuing from") == 2, timeout=30)  # run 3 holds the journal
        refused = _dispatcher(manifest.uri, control, data, journal, log_dir / "refused.log")
        assert refused.wait(30) != 0
        assert "in use by another dispatcher" in (log_dir / "refused.log").read_text()
        runner.join(120)
        assert not runner.is_alive() and "summary" in result, log.read_text()[-3000:]
        assert [d.wait(timeout=60) for d in daemons] == [0, 0], \
            "\n".join(d.output()[-2000:] for d in daemons) + "\n" + log.read_text()[-4000:]
        assert runs[2].wait(30) == 0
    finally:
        consumer.stop()
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
    assert_exactly_once(result["summary"], manifest.num_samples, 2)
    assert "cutting off a torn last line" in log.read_text()


def test_a_dispatcher_restarted_from_its_compacted_journal_finishes_the_job_exactly_once(manifest, log_dir):
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal = log_dir / "dispatch.journal"
    first = _dispatcher(manifest.uri, control, data, journal, log_dir / "dispatch.log")
    secret = log_dir / "dispatch.journal.key"
    consumer, daemons, runner, result = _attached_job(control, data, secret, log_dir, rate=250)
    second = None
    try:
        ctx = zmq.Context()
        stranger = dealer(ctx, control)
        for i, guess in enumerate((b"", b"0" * 64), 1):  # acks without the job secret end nothing
            reply = call(stranger, pb.ControlRequest(ack=pb.Ack(unit_ids=list(range(100))), job_credential=guess), i)
            assert reply.WhichOneof("kind") == "error" and "only the job's consumer" in reply.error.message
        ctx.destroy(linger=0)
        # killed once epoch 0 is done and the journal compacted to a snapshot, so that the restart
        # continues epoch 1 from the snapshot and the lines after it
        assert wait_for(lambda: replay(journal).done_below > 0, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        replayed = replay(journal)
        done_before = replayed.done_below + len(replayed.done)
        assert replayed.done_below <= done_before < 2 * replayed.done_below  # epoch 1 not done
        second = _dispatcher(manifest.uri, control, data, journal, log_dir / "dispatch.log")
        runner.join(120)
        assert not runner.is_alive(), (log_dir / "dispatch.log").read_text()[-3000:]
        codes = [d.wait(timeout=60) for d in daemons]
        assert codes == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
        assert second.wait(30) == 0
    finally:
        consumer.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    summary = result["summary"]
    assert_exactly_once(summary, manifest.num_samples, 2)
    # the restart may have a unit redelivered (its lease outlived the kill in the journal) or not; either way
    # nothing trains twice: samples == unique samples above, and no sample came in two distinct batches
    assert consumer.ledger.collisions == 0
    assert summary.hosts == 2  # counted from the batches, also when the dispatcher is elsewhere
    log = (log_dir / "dispatch.log").read_text()
    assert "continuing from" in log and f"{done_before} units done" in log


def test_a_dispatcher_down_past_the_daemons_leave_after_goes_on_within_seconds_of_its_restart(manifest, log_dir):
    """At the defaults (--leave-after 30, --host-timeout 10, --lease-timeout 600): the dispatcher is killed
    mid-epoch and stays down 35 s, so the daemons leave the job and stop their processes. Restarted from
    its journal, the leases of those processes go back to the queue when their hosts register again, and
    the job finishes exactly once within seconds (it used to wait for the lease timeout: no step for
    150 s and more)."""
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal, log = log_dir / "dispatch.journal", log_dir / "dispatch.log"
    first = _dispatcher(manifest.uri, control, data, journal, log, host_timeout=())
    consumer, daemons, runner, result = _attached_job(control, data, log_dir / "dispatch.journal.key", log_dir,
                                                      rate=60)
    second = None
    try:
        assert wait_for(lambda: journal.exists() and len(replay(journal).done) >= 2, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert wait_for(lambda: all("leaving job" in d.output() for d in daemons), timeout=60), \
            "\n".join(d.output()[-2000:] for d in daemons)
        time.sleep(35 - 30)  # down 35 s in all
        second = _dispatcher(manifest.uri, control, data, journal, log, host_timeout=())
        restarted = time.monotonic()
        runner.join(120)
        took = time.monotonic() - restarted
        assert not runner.is_alive() and "summary" in result, log.read_text()[-3000:]
        assert [d.wait(timeout=60) for d in daemons] == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
    finally:
        consumer.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert_exactly_once(result["summary"], manifest.num_samples, 2)
    left = 2 * manifest.num_samples / 60  # the whole job at the consumer's rate, an upper bound of what was left
    assert took < left + 20, f"the job took {took:.0f} s after the restart (at most {left:.0f} s of steps were left)"


def test_a_rank_of_a_separate_dispatcher_killed_and_run_again_at_once_continues_from_its_checkpoint(
        manifest, log_dir, tmp_path):
    """`stoker train --dispatcher` (checkpoint every 5 steps) is SIGKILLed mid-job and the same command runs
    again at once, while `stoker dispatch` and a worker daemon (defaults) run on. The dispatcher counted done
    what the dead consumer stepped after its checkpoint; the new consumer says where it starts, and those units
    come back, in order: the job finishes, every step after the checkpoint taken once. (It used to deadlock:
    the rank waited for a unit the dispatcher called done, silent for 60 s; and the new consumer was refused
    for 10 s as a second holder of rank 0.)"""
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal, log = log_dir / "dispatch.journal", log_dir / "dispatch.log"
    dispatch = _dispatcher(manifest.uri, control, data, journal, log, host_timeout=(), extra=("--epochs", "4"))
    secret, state = log_dir / "dispatch.journal.key", tmp_path / "ck.json"
    assert wait_for(secret.exists, timeout=30)
    daemon = Daemon(control, "host0", 1, log_dir, once=False)

    def train(json_path, rate: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "stoker", "train", "--dispatcher", control, "--job-secret",
                                 str(secret), "--data-bind", data, "--metrics-port", "-1", "--accel", "simulated",
                                 "--rate", str(rate), "--checkpoint", str(state), "--checkpoint-every", "8", "--resume",
                                 str(state), "--no-progress", "--json", str(json_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    first = second = None
    try:
        first = train(tmp_path / "first.json", rate=40)  # 2.5 steps a second
        assert wait_for(lambda: _checkpointed(state), timeout=90), first.stdout
        time.sleep(2.2)  # about 5 steps past the checkpoint at step 8, before the next at 16: units acked
        first.kill()
        first.wait(10)
        saved = json.loads(state.read_text())
        started = time.monotonic()
        second = train(tmp_path / "second.json", rate=200)
        out, _ = second.communicate(timeout=180)
        took = time.monotonic() - started
    finally:
        for proc in (first, second, dispatch):
            if proc is not None and proc.poll() is None:
                proc.kill()
        daemon.stop()
    assert second.returncode == 0, out[-3000:] + log.read_text()[-3000:]
    summary = json.loads((tmp_path / "second.json").read_text())
    steps_per_epoch = manifest.num_samples // 16
    left = (4 * steps_per_epoch - (saved["epoch"] * steps_per_epoch + saved["step"])) * 16
    assert summary["samples"] == summary["unique_samples"] == left, summary
    said = "\n".join(line for line in log.read_text().splitlines() if "released" not in line)
    assert "of its units done since then go back to the queue" in said, f"{saved}\n{said[-3000:]}\n{out[-2000:]}"
    assert took < 4 * manifest.num_samples / 200 + 40, f"the second run took {took:.0f} s"


def test_ctrl_c_ends_a_rank_whose_dispatcher_is_frozen_within_seconds_saying_what_it_could_not_do(
        manifest, log_dir, tmp_path):
    """`stoker dispatch` SIGSTOPped under a running `stoker train --dispatcher --checkpoint`: Ctrl-C ends the
    run within seconds, exit 130 with its summary, and says the checkpoint could not be saved and why (it used
    to wait 30 s, then exit 2 with an empty `stoker: error: `)."""
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal, log = log_dir / "dispatch.journal", log_dir / "dispatch.log"
    dispatch = _dispatcher(manifest.uri, control, data, journal, log, extra=("--epochs", "40"))
    secret = log_dir / "dispatch.journal.key"
    assert wait_for(secret.exists, timeout=30)
    daemon = Daemon(control, "host0", 1, log_dir)
    train = subprocess.Popen([sys.executable, "-m", "stoker", "train", "--dispatcher", control, "--job-secret",
                              str(secret), "--data-bind", data, "--metrics-port", "-1", "--accel", "simulated",
                              "--rate", "100", "--checkpoint", str(tmp_path / "ck.json"), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        time.sleep(6)  # stepping
        assert train.poll() is None
        dispatch.send_signal(signal.SIGSTOP)
        time.sleep(3)
        interrupted = time.monotonic()
        train.send_signal(signal.SIGINT)
        out, err = train.communicate(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        dispatch.send_signal(signal.SIGCONT)
        for proc in (train, dispatch):
            if proc.poll() is None:
                proc.kill()
        daemon.stop()
    assert train.returncode == 130, out[-2000:] + err[-2000:]
    assert "interrupted (Ctrl-C)" in out and "the checkpoint was not saved: no answer from the dispatcher in 5 s" in err
    assert took < 20, f"Ctrl-C took {took:.0f} s"


def _checkpointed(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text()))
    except (OSError, ValueError):
        return False


def test_with_keys_only_a_consumer_key_attaches_to_a_separate_dispatcher(manifest, log_dir, tmp_path):
    keys = init_keys(tmp_path / "keys")
    add_key(keys, "cpu-0")
    add_key(keys, "rank-0", role="consumer")
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    service = _dispatcher(manifest.uri, control, data, log_dir / "j", log_dir / "dispatch.log", ("--keys", str(keys)))
    with pytest.raises(NotAConsumer, match="only the job's consumer"):  # a worker key is refused as a consumer
        attach(control, "cpu-0", ClientKeys.load(keys, "cpu-0"), timeout_s=30)
    consumer = Consumer(ConsumerConfig(data_bind=data, dispatcher=control, metrics_port=None, keys=str(keys),
                                       key_name="rank-0"), None, given(SimulatedAccelerator(rate=1000)))
    daemon = Daemon(control, "cpu-0", 1, log_dir, extra=("--keys", str(keys)))
    try:
        summary = consumer.run()
        assert daemon.wait(timeout=30) == 0, daemon.output()
        assert service.wait(30) == 0
    finally:
        consumer.stop()
        daemon.stop()
        if service.poll() is None:
            service.kill()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert not (log_dir / "j.key").exists()  # with keys there is no job secret to keep


STRANGER = 65534  # nobody: another local user


def test_a_job_secret_another_user_planted_stops_dispatch_at_start_with_the_reason(manifest):
    """Another local user, as its own process, writes a secret of its choosing (readable by all) where
    `stoker dispatch` keeps one, and takes the name of the private directory first: the dispatcher
    adopts neither, it exits at start with one line that says whose the file is."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root")
    shared = Path(tempfile.mkdtemp(prefix="stoker-shared-"))  # a world-writable temp dir, as /tmp is
    os.chmod(shared, 0o1777)
    try:
        planted, taken = shared / "job.secret", shared / f"stoker-{os.geteuid()}"
        subprocess.run(["sh", "-c", f"umask 022; printf %s {'ab' * 32} > {planted}; mkdir -m 777 {taken}"],
                       user=STRANGER, group=STRANGER, check=True, cwd="/")
        env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "STOKER_JOB_SECRET",
                                                                 "XDG_RUNTIME_DIR")}
        for extra, refused in ((["--job-secret", str(planted)], f"{planted} belongs to uid {STRANGER}"),
                               ([], f"{taken} belongs to uid {STRANGER}")):
            started = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", "stoker", "dispatch", "--data", manifest.uri, "--metrics-port", "-1",
                 "--control-bind", f"tcp://127.0.0.1:{free_port()}", *extra],
                capture_output=True, text=True, timeout=60, env=env | {"TMPDIR": str(shared)})
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1, result.stderr
            assert lines[0].startswith("stoker: error: job secret refused") and refused in lines[0], lines[0]
            assert time.monotonic() - started < 30
        assert planted.read_text() == "ab" * 32 and os.listdir(taken) == []  # nothing adopted, nothing written
    finally:
        shutil.rmtree(shared)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KB tmpfs (root only: skipped elsewhere), unmounted after the test."""
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_dispatcher_whose_journal_disk_fills_says_so_and_exits(manifest, log_dir, tiny_disk):
    """The journal's disk fills mid-job: the dispatcher logs the journal's path with 'No space left on
    device' and exits non-zero within seconds (it used to sit alive and silent, its control socket
    closed, because a socket left open held the context's term())."""
    control, data = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    journal, log = tiny_disk / "dispatch.journal", log_dir / "dispatch.log"
    secret = tiny_disk / "dispatch.journal.key"
    dispatcher = _dispatcher(manifest.uri, control, data, journal, log, extra=("--epochs", "50"))
    consumer, daemons = None, []
    try:
        assert wait_for(lambda: journal.exists() and secret.exists(), timeout=30), log.read_text()
        filler = tiny_disk / "filler"
        with open(filler, "wb", buffering=0) as out:  # fill the disk: the journal has the rest of its last page
            try:
                while True:
                    out.write(b"\0" * 4096)
            except OSError:
                pass
        consumer, daemons, runner, result = _attached_job(control, data, secret, log_dir, rate=2000)
        code = dispatcher.wait(60)
        assert code not in (0, None), log.read_text()[-3000:]
        assert "No space left on device" in log.read_text() and str(journal) in log.read_text()
    finally:
        dispatcher.kill()
        dispatcher.wait()
        if consumer is not None:
            consumer.stop()
        for d in daemons:
            d.stop()


def test_a_dispatcher_on_free_ports_prints_the_ports_it_took(manifest, tmp_path):
    """`--control-bind tcp://127.0.0.1:0 --metrics-port 0`: the line it prints names the ports it bound (it
    used to print the requested tcp://127.0.0.1:0, which no worker can connect to, and no metrics port)."""
    cmd = [sys.executable, "-m", "stoker", "dispatch", "--data", manifest.uri, "--control-bind",
           "tcp://127.0.0.1:0", "--metrics-port", "0", "--job-secret", str(tmp_path / "secret")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr", "w"), text=True, cwd=ROOT,
                            env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=30)
        found = re.search(r"connect to tcp://127\.0\.0\.1:(\d+); metrics on :(\d+)", line)
        assert found, line + (tmp_path / "stderr").read_text()
        control, metrics = int(found[1]), int(found[2])
        assert control != 0 and metrics != 0, line
        socket.create_connection(("127.0.0.1", control), timeout=5).close()  # the dispatcher listens there
        page = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert "stoker_dispatcher_units" in page
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
