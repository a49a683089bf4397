"""Data-parallel feeding: real `torchrun` DDP jobs (gloo, an all-reduce in every step) fed by real
worker daemons, in the shapes real jobs have.

The data set (157 images) does not divide by the world size nor by the batch size (13): ranks'
streams differ by a row, and a batch, so the shorter ranks split their last batch and all take
the same number of steps. DDP all-reduces gradients in every backward pass, so the ranks step in
lock-step: a rank that ran out of steps first, or a fleet that makes one rank's batches while
another rank waits for its own, would hang the job. Every job here must finish with every
sample exactly once per epoch and equal steps on every rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from stoker.pipeline.store.shards import Manifest, ShardReader, ShardWriter
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient
from tests.helpers import Daemon, free_port, scrape, wait_for

SIZE = 157
SCRIPT = Path(__file__).parents[1] / "ddp_script.py"


@pytest.fixture(scope="module")
def odd_manifest(manifest, tmp_path_factory) -> Manifest:
    dst = tmp_path_factory.mktemp("odd")
    writer = ShardWriter(dst, target_bytes=2 << 20)
    taken = 0
    for index in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            if taken < SIZE:
                writer.add(reader.key(row), reader.label(row), bytes(reader.jpeg(row)))
                taken += 1
    odd = Manifest(kind="imagenet", classes=manifest.classes, shards=writer.close())
    odd.save(dst / "manifest.json")
    return Manifest.load(dst / "manifest.json")


def _torchrun(manifest: Manifest, out: Path, port: int, ranks: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", str(ranks), "--master-port", str(free_port()), str(SCRIPT),
           "--data", manifest.uri, "--out", str(out), "--control-port", str(port), *extra]
    return subprocess.Popen(cmd, stdout=open(out / "torchrun.log", "a"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # its ranks are killed with it, whatever ends the test


def _kill_group(job: subprocess.Popen, out: Path) -> None:
    """torchrun and every rank it started: torchrun starts each rank in a session of its own, so a hung
    rank outlives its killed group; it is found by the output folder on its command line."""
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()
    subprocess.run(["pkill", "-KILL", "-f", f"ddp_script.py .*--out {out}( |$)"], capture_output=True)


def _batches_sent(daemon: Daemon) -> float:
    try:
        return scrape(daemon.metrics_port).get("stoker_worker_batches_total", 0)
    except OSError:
        return 0


def _records(out: Path, ranks: int, suffix: str = "") -> dict[int, dict]:
    """Each rank's record: its steps, len(loader) per epoch, and (rank 0) the units re-leased."""
    found = {}
    for rank in range(ranks):
        lines = [json.loads(line) for line in (out / f"rank-{rank}{suffix}.jsonl").read_text().splitlines()]
        found[rank] = {"steps": [x for x in lines if "step" in x],
                       "len": {x["epoch"]: x["len"] for x in lines if "len" in x},
                       "units_released": next((x["units_released"] for x in lines if "units_released" in x), None)}
    return found


class Fleet:
    """`hosts` worker daemons of `procs` processes each, for the job at `port`. `once`: they leave
    after the job, as `stoker worker --once`; otherwise they outlive it, as systemd units do, and
    are up (asking to register) before the job starts, so that every one of them joins even a job
    that crashes after a few steps (the tests of such fleets say what each daemon did)."""

    def __init__(self, port: int, log_dir: Path, hosts: int, procs: int, once: bool = True,
                 leave_after: float | None = 5.0) -> None:
        """`leave_after`: the daemons' --leave-after; None: the default users run with."""
        extra = () if leave_after is None else ("--leave-after", str(leave_after))
        self.daemons = [Daemon(f"tcp://127.0.0.1:{port}", f"host{i}", procs, log_dir, once=once, extra=extra)
                        for i in range(hosts)]
        if not once:
            assert wait_for(lambda: all("registering with" in d.output() for d in self.daemons), timeout=60), \
                "not every daemon came up:\n" + self.logs()

    def logs(self) -> str:
        return "\n".join(d.output()[-2000:] for d in self.daemons)

    def stop(self) -> None:
        for d in self.daemons:
            d.stop()


def _run(manifest: Manifest, out: Path, port: int, ranks: int, fleet: Fleet, *extra: str,
         expect_code: int = 0, timeout: float = 240, during=None) -> None:
    """One torchrun job to its end; `during(job)` runs while it goes."""
    out.mkdir(exist_ok=True)
    job = _torchrun(manifest, out, port, ranks, *extra)
    try:
        if during is not None:
            during(job)
        code = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_group(job, out)
    log = (out / "torchrun.log").read_text()
    assert code == expect_code or (expect_code and code not in (0, None)), \
        f"torchrun exited {code}\n" + log[-3000:] + "\n" + fleet.logs()


def _job(manifest: Manifest, out: Path, log_dir: Path, *extra: str, ranks: int = 2, hosts: int = 2,
         procs: int = 1, during=None) -> dict[int, dict]:
    """The DDP job with a fleet of its own that leaves when the job is finished."""
    port = free_port()
    fleet = Fleet(port, log_dir, hosts, procs)
    try:
        _run(manifest, out, port, ranks, fleet, *extra, during=during and (lambda job: during(fleet)))
    finally:
        fleet.stop()
    return _records(out, ranks, "-resumed" if "--resume" in extra else "")


def _check_exactly_once_and_even(manifest: Manifest, ranks: dict, epochs: int, epochs_from: int = 0) -> None:
    for epoch in range(epochs_from, epochs):
        streams = [[s for s in ranks[r]["steps"] if s["epoch"] == epoch] for r in ranks]
        assert len({len(s) for s in streams}) == 1 and streams[0], f"epoch {epoch}: unequal steps"
        ids = [i for stream in streams for s in stream for i in s["ids"]]
        assert sorted(ids) == list(range(manifest.num_samples)), f"epoch {epoch}: not every sample exactly once"
        assert all(s["rows"] == len(s["ids"]) > 0 for stream in streams for s in stream)  # never empty, never padded
        for r, stream in zip(ranks, streams, strict=True):
            assert [s["step"] for s in stream] == list(range(len(stream)))
            if epoch in ranks[r]["len"]:
                assert ranks[r]["len"][epoch] == len(stream)  # len(loader) was exact


def _longest_gap(steps: list[dict]) -> float:
    times = [s["at"] for s in steps]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def test_torchrun_ddp_gets_every_sample_once_and_equal_steps(odd_manifest, tmp_path, log_dir):
    ranks = _job(odd_manifest, tmp_path / "run", log_dir)
    _check_exactly_once_and_even(odd_manifest, ranks, 2)
    rows = [s["rows"] for s in ranks[1]["steps"] if s["epoch"] == 0]
    assert max(rows) == 13 and sum(r < 13 for r in rows) <= 2  # short batches only at the epoch's end


@pytest.mark.parametrize(("world", "hosts", "procs"), [(2, 1, 1), (3, 2, 1), (4, 1, 1), (4, 2, 3)],
                         ids=["2-ranks-1-proc", "3-ranks-2-procs", "4-ranks-1-proc", "4-ranks-6-procs"])
def test_lockstep_ranks_finish_exactly_once_whatever_the_fleet(odd_manifest, tmp_path, log_dir, world, hosts, procs):
    """Fewer worker processes than ranks (down to one for four) and more: a process never waits on
    one rank's credit while another rank waits for a batch it could make."""
    ranks = _job(odd_manifest, tmp_path / "run", log_dir, "--model", "linear", "--batch-size", "8",
                 ranks=world, hosts=hosts, procs=procs)
    _check_exactly_once_and_even(odd_manifest, ranks, 2)


def test_a_worker_host_killed_mid_epoch_costs_seconds_not_the_host_timeout(odd_manifest, tmp_path, log_dir):
    """host0 (daemon and decode process) is SIGKILLed as soon as it has sent a batch, so it dies
    holding a lease. Its connections close, and the dispatcher re-leases its units then: the
    longest wait between two steps stays far below the host timeout (30 s here)."""
    def kill_host0(fleet: Fleet) -> None:
        host0 = fleet.daemons[0]
        assert wait_for(lambda: _batches_sent(host0) >= 1, timeout=120, interval=0.01)
        for pid in host0.children():
            os.kill(pid, signal.SIGKILL)
        host0.proc.send_signal(signal.SIGKILL)

    ranks = _job(odd_manifest, tmp_path / "run", log_dir, "--epochs", "6", "--host-timeout", "30",
                 during=kill_host0)
    assert ranks[0]["units_released"] > 0  # the dead host's leases went to the other host
    assert ranks[1]["units_released"] > 0  # and rank 1 says so too: the dispatcher's figure, not its own
    _check_exactly_once_and_even(odd_manifest, ranks, 6)
    gap = max(_longest_gap(ranks[r]["steps"]) for r in ranks)
    print(f"longest wait between two steps with a host killed: {gap:.1f} s (host timeout 30 s), "
          f"{ranks[0]['units_released']} unit(s) re-leased")
    assert gap < 6.0


def test_a_resumed_job_yields_exactly_the_batches_an_uninterrupted_one_does(odd_manifest, tmp_path, log_dir):
    model = ("--model", "linear")
    whole = _job(odd_manifest, tmp_path / "whole", log_dir, *model)
    part = tmp_path / "part"
    first = _job(odd_manifest, part, log_dir, *model, "--stop-after", "10")  # epochs have 7 steps: mid epoch 1
    state = json.loads((part / "state.json").read_text())
    assert (state["epoch"], state["step"], len(state["ranks"])) == (1, 3, 2)
    rest = _job(odd_manifest, part, log_dir, *model, "--resume")
    for r in range(2):
        steps = [(s["epoch"], s["step"], s["ids"]) for s in whole[r]["steps"]]
        resumed = [(s["epoch"], s["step"], s["ids"]) for s in first[r]["steps"] + rest[r]["steps"]]
        assert resumed == steps, f"rank {r}: the resumed job's batches differ from the uninterrupted job's"


def _before(steps: list[dict], state: dict) -> list[dict]:
    """The steps a checkpoint holds: those before its (epoch, step)."""
    return [s for s in steps if (s["epoch"], s["step"]) < (state["epoch"], state["step"])]


@pytest.mark.parametrize("after_they_left", [False, True], ids=["at-once", "after-leave-after"])
def test_a_job_restarted_in_place_continues_exactly_once_while_the_daemons_run(odd_manifest, tmp_path, log_dir,
                                                                                after_they_left):
    """3 ranks fed by 4 long-lived worker daemons (they outlive jobs, as systemd units do). Rank 0
    saves the data position at step 8; every rank dies at step 14 (a crash: no goodbye); the same
    torchrun command runs again with load_state_dict(), at once or after the daemons have left the
    silent job (--leave-after 5) and asked to register again for 5 s unanswered: it finishes, every
    sample once per epoch, equal steps."""
    port = free_port()
    out = tmp_path / "run"
    fleet = Fleet(port, log_dir, hosts=4, procs=1, once=False, leave_after=5.0 if after_they_left else None)
    common = ("--model", "linear", "--batch-size", "8", "--epochs", "3")
    try:
        _run(odd_manifest, out, port, 3, fleet, *common, "--save-at", "8", "--crash-after", "14", expect_code=1)
        state = json.loads((out / "state.json").read_text())
        first = _records(out, 3)
        if after_they_left:
            assert wait_for(lambda: all("leaving job" in d.output() for d in fleet.daemons), timeout=30), \
                "not every daemon left the crashed job:\n" + fleet.logs()
            assert wait_for(lambda: all(d.unanswered() for d in fleet.daemons), timeout=30), \
                "not every daemon is asking to register again:\n" + fleet.logs()
        _run(odd_manifest, out, port, 3, fleet, *common, "--resume", timeout=120)
        rest = _records(out, 3, "-resumed")
        assert all(d.proc.poll() is None for d in fleet.daemons)  # the daemons live on, for the next job
    finally:
        fleet.stop()
    whole = {r: {"steps": _before(first[r]["steps"], state) + rest[r]["steps"], "len": rest[r]["len"]} for r in rest}
    _check_exactly_once_and_even(odd_manifest, whole, 3)


def test_a_restart_in_place_takes_back_processes_that_held_credit_of_the_dead_ranks(odd_manifest, tmp_path, log_dir):
    """Fewer worker processes than ranks (1 for 3), slower than the steps (128 px images): when every
    rank crashes, the process holds credit the dead ranks granted and is making or sending their batch.
    Run again from the checkpoint at the default --leave-after, with the daemon still up: the daemon
    sees a new run of the same job id, stops that process and joins the new run, which finishes
    exactly once within seconds. (The send used to block for ever on the dead rank's socket, and the
    daemon, heartbeating a dispatcher under the same job id, never left: the resume hung.)"""
    port = free_port()
    out = tmp_path / "run"
    fleet = Fleet(port, log_dir, hosts=1, procs=1, once=False, leave_after=None)
    common = ("--model", "linear", "--batch-size", "8", "--epochs", "3", "--image-size", "128")
    try:
        _run(odd_manifest, out, port, 3, fleet, *common, "--save-at", "8", "--crash-after", "14", expect_code=1)
        state = json.loads((out / "state.json").read_text())
        first = _records(out, 3)
        started = time.monotonic()
        _run(odd_manifest, out, port, 3, fleet, *common, "--resume", timeout=90)
        assert time.monotonic() - started < 60, "the resumed job waited on the old run's process"
        rest = _records(out, 3, "-resumed")
        assert "runs job" in fleet.logs() and fleet.daemons[0].proc.poll() is None
    finally:
        fleet.stop()
    whole = {r: {"steps": _before(first[r]["steps"], state) + rest[r]["steps"], "len": rest[r]["len"]} for r in rest}
    _check_exactly_once_and_even(odd_manifest, whole, 3)


def test_a_checkpoint_of_three_ranks_is_continued_by_two_and_by_four(odd_manifest, tmp_path, log_dir):
    """3 ranks save the data position at step 9 (epoch 1, step 2 of 7) and leave. The same script at 2
    ranks, and again at 4, continues from it: the rows no rank had stepped are cut into the new world
    size's streams. Epoch 1 is every sample once across the two runs, epoch 2 once at the new world
    size, every rank of a run takes the same steps, and the resumed epoch's steps go on from step 2."""
    common = ("--model", "linear", "--batch-size", "8", "--epochs", "3")
    part = tmp_path / "part"
    first = _job(odd_manifest, part, log_dir, *common, "--stop-after", "9", ranks=3, hosts=1, procs=2)
    state = json.loads((part / "state.json").read_text())
    assert (state["epoch"], state["step"], len(state["ranks"])) == (1, 2, 3)
    before = {r: _before(first[r]["steps"], state) for r in first}
    for world in (2, 4):
        out = tmp_path / f"at-{world}"
        out.mkdir()
        (out / "state.json").write_text(json.dumps(state))
        rest = _job(odd_manifest, out, log_dir, *common, "--resume", ranks=world, hosts=1, procs=2)
        assert len({len(rest[r]["steps"]) for r in rest}) == 1, "unequal steps at the new world size"
        assert all(rest[r]["steps"][0]["epoch"] == 1 and rest[r]["steps"][0]["step"] == 2 for r in rest)
        resumed_steps = [s for s in rest[0]["steps"] if s["epoch"] == 1]
        assert rest[0]["len"][1] == 2 + len(resumed_steps)  # len(loader) counts the steps taken before too
        stepped = sorted(i for ranks in (before, {r: rest[r]["steps"] for r in rest}) for r in ranks
                         for s in ranks[r] if s["epoch"] == 1 for i in s["ids"])
        assert stepped == list(range(SIZE)), f"epoch 1 at {world} ranks: not every sample exactly once"
        _check_exactly_once_and_even(odd_manifest, {r: {"steps": [s for s in rest[r]["steps"] if s["epoch"] == 2],
                                                        "len": {2: rest[r]["len"][2]}} for r in rest}, 3,
                                     epochs_from=2)


def test_a_job_started_again_without_a_checkpoint_is_joined_by_the_running_daemons(odd_manifest, tmp_path, log_dir):
    """The job crashes before its first checkpoint and the same command runs it again: a new job (a new
    id) on the same control port. The long-lived daemons see the dispatcher serve another job and
    join it at once, instead of restarting processes of the old one against ranks that refuse them."""
    port = free_port()
    fleet = Fleet(port, log_dir, hosts=2, procs=1, once=False, leave_after=60)
    common = ("--model", "linear", "--batch-size", "8")
    try:
        _run(odd_manifest, tmp_path / "first", port, 2, fleet, *common, "--crash-after", "3", expect_code=1)
        started = time.monotonic()
        _run(odd_manifest, tmp_path / "again", port, 2, fleet, *common, timeout=120)
        assert time.monotonic() - started < 60  # not the daemons' --leave-after
        assert all("serves another job" in d.output() for d in fleet.daemons), fleet.logs()
    finally:
        fleet.stop()
    _check_exactly_once_and_even(odd_manifest, _records(tmp_path / "again", 2), 2)


def test_a_finished_job_resumed_from_an_earlier_checkpoint_gets_the_daemons_back(odd_manifest, tmp_path, log_dir):
    """The job finishes (the daemons hear it) but its last checkpoint is from step 5; run again from it
    (say, the checkpoint of the model that was kept), the same job id runs again and the daemons
    that heard it finish join it: the rest of the job is every sample once."""
    port = free_port()
    fleet = Fleet(port, log_dir, hosts=2, procs=1, once=False)
    out = tmp_path / "run"
    common = ("--model", "linear", "--batch-size", "8")
    try:
        _run(odd_manifest, out, port, 2, fleet, *common, "--save-at", "5")
        assert wait_for(lambda: all("joined job" in d.output() for d in fleet.daemons), timeout=10)
        state = json.loads((out / "state.json").read_text())
        first = _records(out, 2)
        _run(odd_manifest, out, port, 2, fleet, *common, "--resume", timeout=120)
        rest = _records(out, 2, "-resumed")
    finally:
        fleet.stop()
    _check_exactly_once_and_even(odd_manifest, {r: {"steps": _before(first[r]["steps"], state) + rest[r]["steps"],
                                                    "len": {}} for r in rest}, 2)


@pytest.mark.parametrize("world", [3, 2])
def test_a_checkpoint_at_an_epochs_last_step_resumes_with_the_next_epoch(odd_manifest, tmp_path, log_dir, world):
    """3 ranks save the position right after epoch 0's last step (step 7 of 7) and stop; the job goes on
    from epoch 1, step 0, at 3 ranks or at 2."""
    common = ("--model", "linear", "--batch-size", "8", "--epochs", "2")
    out = tmp_path / "run"
    first = _job(odd_manifest, out, log_dir, *common, "--stop-after", "7", ranks=3, hosts=1, procs=2)
    state = json.loads((out / "state.json").read_text())
    assert (state["epoch"], state["step"]) == (1, 0) and len(first[0]["steps"]) == 7
    rest = _job(odd_manifest, out, log_dir, *common, "--resume", ranks=world, hosts=1, procs=2)
    _check_exactly_once_and_even(odd_manifest, first, 1)
    _check_exactly_once_and_even(odd_manifest, rest, 2, epochs_from=1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_stoker_run_world_size_two_reports_each_rank_and_the_job(odd_manifest, tmp_path, drop_last):
    """157 images over 2 ranks at batch 13: 79 + 78 rows, or with --drop-last 78 + 78 (6 whole batches each).
    Both ranks record their steps (--record-steps, issue 49 item 4), and `stoker audit` reads the same."""
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", odd_manifest.uri, "--world-size", "2",
                             "--epochs", "2", "--batch-size", "13", "--no-progress", "--json", str(out),
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "-1", "--worker-metrics-port", "-1",
                             "--record-steps", str(tmp_path / "steps"), *(["--drop-last"] if drop_last else [])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["job.json", "steps-rank-0.jsonl",
                                                                      "steps-rank-1.jsonl"]
    audit = subprocess.run([sys.executable, "-m", "stoker", "audit", str(tmp_path / "steps"), "--json", "-"],
                           capture_output=True, text=True, timeout=60)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    per_epoch = 156 if drop_last else SIZE
    epochs = json.loads(audit.stdout)["epochs"]
    assert [(e["delivered"], e["duplicated"], e["missing"]) for e in epochs] == [(per_epoch, 0, 0)] * 2
    summary = json.loads(out.read_text())
    assert summary["unique_samples"] == summary["samples"] == 2 * per_epoch
    assert summary["per_epoch_unique"] == [per_epoch, per_epoch]
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["steps"] == ranks[1]["steps"]
    assert sum(r["samples"] for r in ranks) == 2 * per_epoch and abs(ranks[0]["samples"] - ranks[1]["samples"]) <= 2
    if drop_last:
        assert ranks[0]["steps"] == 2 * 6 and ranks[0]["samples"] == ranks[1]["samples"] == 2 * 78
    assert "rank 1:" in result.stdout and "to 2 ranks" in result.stdout


def _rank_zero(manifest: Manifest, port: int, **config):
    from stoker.accel.consumer import Consumer, ConsumerConfig
    from stoker.pipeline.job import JobConfig

    consumer = Consumer(ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{port}",
                                       **{"metrics_port": None, **config}),
                        JobConfig(manifest_uri=manifest.uri, batch_size=13, world_size=2))
    consumer.start()
    return consumer


def test_a_rank_that_cannot_join_is_told_why_at_start_up(odd_manifest):
    from stoker.accel.consumer import Consumer, ConsumerConfig
    from stoker.accel.control.remote import RankRefused

    port = free_port()
    zero = _rank_zero(odd_manifest, port)
    ranks = []
    try:
        cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", dispatcher=f"tcp://127.0.0.1:{port}", metrics_port=None,
                             attach_timeout_s=10)
        with pytest.raises(RankRefused, match="world size 2, not 3"):
            Consumer(cfg, None, rank=1, world_size=3)
        with pytest.raises(RankRefused, match="outside the job's ranks 0..1"):
            Consumer(cfg, None, rank=5)
        ranks.append(Consumer(cfg, None, rank=1))
        ranks[0].start()
        assert wait_for(lambda: zero.dispatcher.dispatcher.liveness.endpoint(1) is not None, timeout=10)
        with pytest.raises(RankRefused, match="rank 1 is already taken"):
            Consumer(cfg, None, rank=1)  # a second process claiming a rank that is alive
    finally:
        for consumer in ranks:
            consumer.stop()
        zero.stop()


def test_a_rank_that_dies_is_reported_not_waited_on_silently(odd_manifest, caplog):
    """Rank 1 (a real `stoker train --rank 1` process) is killed with SIGKILL: rank 0's dispatcher
    says so in its log and in stoker_dispatcher_ranks_silent within the host timeout."""
    port = free_port()
    zero = _rank_zero(odd_manifest, port, metrics_port=0, host_timeout_s=2.0)
    rank = subprocess.Popen([sys.executable, "-m", "stoker", "train", "--rank", "1", "--world-size", "2",
                             "--dispatcher", f"tcp://127.0.0.1:{port}", "--data-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "-1", "--no-progress"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: zero.dispatcher.dispatcher.liveness.endpoint(1) is not None, timeout=30)
        assert scrape(zero.metrics_port)["stoker_dispatcher_ranks_silent"] == 0
        rank.kill()
        rank.wait()
        killed = time.monotonic()
        assert wait_for(lambda: scrape(zero.metrics_port)["stoker_dispatcher_ranks_silent"] == 1, timeout=15)
        assert time.monotonic() - killed < 2.0 + 3.0  # the host timeout, and a tick or two
        assert "rank 1 has not been heard from" in caplog.text
    finally:
        rank.kill()
        zero.stop()


def test_a_rank_without_its_dispatcher_fails_with_a_clear_error(tmp_path):
    (tmp_path / "secret").write_text("ab" * 32)
    (tmp_path / "secret").chmod(0o600)  # a secret file open to others is refused (protos.private_files)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", "train", "--rank", "1", "--world-size", "2",
                             "--dispatcher", f"tcp://127.0.0.1:{free_port()}", "--attach-timeout", "2",
                             "--metrics-port", "-1", "--job-secret", str(tmp_path / "secret")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and time.monotonic() - started < 20, result.stderr
    assert "no dispatcher at tcp://127.0.0.1:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_rank_the_workers_cannot_reach_is_named_in_seconds(odd_manifest, log_dir, caplog, monkeypatch):
    """Rank 1 says it receives at an address where nothing listens (a wrong --advertise-host, a
    firewall): the worker that leases its unit hears nothing from it, hands the unit back after
    10 s, and both the worker's log and rank 0's name that address and the setting to change."""
    monkeypatch.setenv("STOKER_JOB_SECRET", "cd" * 32)
    port = free_port()
    zero = _rank_zero(odd_manifest, port)
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    rank1 = ControlClient(ctx, f"tcp://127.0.0.1:{port}", "rank1-fake")
    try:
        reply = rank1.request(pb.ControlRequest(attach=pb.Attach(consumer_id="rank1-fake", rank=1, world_size=2,
                                                                 data_endpoint=nowhere),
                                                job_credential=("cd" * 32).encode()))
        assert reply.WhichOneof("kind") == "attached"
        daemon = Daemon(f"tcp://127.0.0.1:{port}", "host0", 1, log_dir, once=False)
        assert wait_for(lambda: f"rank 1's data socket at {nowhere}" in caplog.text, timeout=30), daemon.output()
        assert "--advertise-host" in caplog.text
        assert wait_for(lambda: nowhere in daemon.output() and "has said nothing" in daemon.output(), timeout=10)
    finally:
        rank1.close()
        ctx.term()
        zero.stop()


def test_import_stoker_stays_light():
    code = ("import sys, stoker, stoker.cli, stoker.workers.daemon, stoker.workers.process; "
            "print(sorted(m for m in ('torch', 'nvidia.dali', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
