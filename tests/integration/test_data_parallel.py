"""Data-parallel feeding: a real `torchrun --nproc-per-node 2` DDP script, fed by real worker daemons.

The data set (157 images) does not divide by the world size nor by the batch size (13): one
rank's stream is a row longer, and a batch longer, than the other's, so the shorter rank
splits its last batch and both take the same number of steps. DDP all-reduces gradients in
every backward pass: a rank that ran out of steps first would hang the other.
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

from pipeline.shards import Manifest, ShardReader, ShardWriter
from tests.helpers import Daemon, free_port, scrape, wait_for
from workers.process import PATIENCE_S

SIZE = 157
HOST_TIMEOUT_S = 3.0  # ddp_script.py's
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


def _torchrun(manifest: Manifest, out: Path, port: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT),
           "--data", manifest.uri, "--out", str(out), "--control-port", str(port), *extra]
    return subprocess.Popen(cmd, stdout=open(out / "torchrun.log", "a"), stderr=subprocess.STDOUT, env=env)


def _batches_sent(daemon: Daemon) -> float:
    try:
        return scrape(daemon.metrics_port).get("stoker_worker_batches_total", 0)
    except OSError:
        return 0


def _job(manifest: Manifest, out: Path, log_dir: Path, *extra: str, kill_a_host: bool = False) -> dict:
    """The DDP job with two worker hosts; with kill_a_host, host0 is SIGKILLed (daemon and decode
    process) as soon as it has sent its first batch, so it dies holding that unit's lease."""
    out.mkdir(exist_ok=True)
    port = free_port()
    run = _torchrun(manifest, out, port, *extra)
    daemons = [Daemon(f"tcp://127.0.0.1:{port}", f"host{i}", 1, log_dir, extra=("--leave-after", "5"))
               for i in range(2)]
    try:
        if kill_a_host:
            assert wait_for(lambda: _batches_sent(daemons[0]) >= 1, timeout=120, interval=0.01)
            for pid in daemons[0].children():
                os.kill(pid, signal.SIGKILL)
            daemons[0].proc.send_signal(signal.SIGKILL)
        code = run.wait(timeout=240)
        log = (out / "torchrun.log").read_text()
        assert code == 0, log[-4000:] + "\n".join(d.output()[-1500:] for d in daemons)
    finally:
        if run.poll() is None:
            run.kill()
        for d in daemons:
            d.stop()
    suffix = "-resumed" if "--resume" in extra else ""
    return {r: json.loads((out / f"rank-{r}{suffix}.json").read_text()) for r in range(2)}


def _check_exactly_once_and_even(manifest: Manifest, ranks: dict, epochs: int) -> None:
    for epoch in range(epochs):
        streams = [[s for s in ranks[r]["steps"] if s["epoch"] == epoch] for r in range(2)]
        assert len(streams[0]) == len(streams[1]) > 0  # the same number of steps on both ranks
        ids = [i for stream in streams for s in stream for i in s["ids"]]
        assert sorted(ids) == list(range(manifest.num_samples)), f"epoch {epoch}: not every sample exactly once"
        assert all(s["rows"] == len(s["ids"]) > 0 for stream in streams for s in stream)  # never empty, never padded
        assert [s["step"] for s in streams[0]] == list(range(len(streams[0])))
        for r in range(2):
            assert ranks[r]["len"][epoch] == len(streams[r])  # len(loader) was exact


def test_torchrun_ddp_gets_every_sample_once_and_equal_steps(odd_manifest, tmp_path, log_dir):
    ranks = _job(odd_manifest, tmp_path / "run", log_dir)
    _check_exactly_once_and_even(odd_manifest, ranks, 2)
    rows = [s["rows"] for s in ranks[1]["steps"] if s["epoch"] == 0]
    assert max(rows) == 13 and sum(r < 13 for r in rows) <= 2  # short batches only at the epoch's end


def test_a_worker_host_killed_mid_epoch_loses_nothing_and_repeats_nothing(odd_manifest, tmp_path, log_dir):
    ranks = _job(odd_manifest, tmp_path / "run", log_dir, "--epochs", "6", kill_a_host=True)
    assert ranks[0]["units_released"] > 0  # the dead host's leases went to the other host
    _check_exactly_once_and_even(odd_manifest, ranks, 6)
    times = [s["at"] for s in ranks[0]["steps"]]
    stall = max(b - a for a, b in zip(times, times[1:], strict=False))
    print(f"longest wait between two steps with a host killed: {stall:.1f} s (host timeout 3 s)")
    assert stall < HOST_TIMEOUT_S + PATIENCE_S + 3.0  # the ranks wait for the re-lease, not longer


def test_a_resumed_job_yields_exactly_the_batches_an_uninterrupted_one_does(odd_manifest, tmp_path, log_dir):
    whole = _job(odd_manifest, tmp_path / "whole", log_dir)
    part = tmp_path / "part"
    first = _job(odd_manifest, part, log_dir, "--stop-after", "10")  # epochs have 7 steps: mid epoch 1
    state = json.loads((part / "state.json").read_text())
    assert (state["epoch"], state["step"], len(state["ranks"])) == (1, 3, 2)
    rest = _job(odd_manifest, part, log_dir, "--resume")
    for r in range(2):
        steps = [(s["epoch"], s["step"], s["ids"]) for s in whole[r]["steps"]]
        resumed = [(s["epoch"], s["step"], s["ids"]) for s in first[r]["steps"] + rest[r]["steps"]]
        assert resumed == steps, f"rank {r}: the resumed job's batches differ from the uninterrupted job's"


@pytest.mark.parametrize("drop_last", [False, True])
def test_stoker_run_world_size_two_reports_each_rank_and_the_job(odd_manifest, tmp_path, drop_last):
    """157 images over 2 ranks at batch 13: 79 + 78 rows, or with --drop-last 78 + 78 (6 whole batches each)."""
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", odd_manifest.uri, "--world-size", "2",
                             "--epochs", "2", "--batch-size", "13", "--no-progress", "--json", str(out),
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "-1", "--worker-metrics-port", "-1",
                             *(["--drop-last"] if drop_last else [])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())
    per_epoch = 156 if drop_last else SIZE
    assert summary["unique_samples"] == summary["samples"] == 2 * per_epoch
    assert summary["per_epoch_unique"] == [per_epoch, per_epoch]
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["steps"] == ranks[1]["steps"]
    assert sum(r["samples"] for r in ranks) == 2 * per_epoch and abs(ranks[0]["samples"] - ranks[1]["samples"]) <= 2
    if drop_last:
        assert ranks[0]["steps"] == 2 * 6 and ranks[0]["samples"] == ranks[1]["samples"] == 2 * 78
    assert "rank 1:" in result.stdout and "to 2 ranks" in result.stdout


def _rank_zero(manifest: Manifest, port: int, **config):
    from accel.consumer import Consumer, ConsumerConfig
    from protos.job import JobConfig

    consumer = Consumer(ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{port}",
                                       **{"metrics_port": None, **config}),
                        JobConfig(manifest_uri=manifest.uri, batch_size=13, world_size=2))
    consumer.start()
    return consumer


def test_a_rank_that_cannot_join_is_told_why_at_start_up(odd_manifest):
    from accel.consumer import Consumer, ConsumerConfig
    from accel.control.remote import RankRefused

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
        assert wait_for(lambda: zero.dispatcher.endpoint(1) is not None, timeout=10)
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
        assert wait_for(lambda: zero.dispatcher.endpoint(1) is not None, timeout=30)
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
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", "train", "--rank", "1", "--world-size", "2",
                             "--dispatcher", f"tcp://127.0.0.1:{free_port()}", "--attach-timeout", "2",
                             "--metrics-port", "-1", "--job-secret", str(tmp_path / "secret")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and time.monotonic() - started < 20, result.stderr
    assert "no dispatcher at tcp://127.0.0.1:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_import_stoker_stays_light():
    code = ("import sys, stoker, stoker.cli, workers.daemon, workers.process; "
            "print(sorted(m for m in ('torch', 'nvidia.dali', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
