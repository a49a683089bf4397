"""Ingest ceiling of a rank: how fast it takes batches when nothing decodes them, against raw pyzmq.

(a) raw pyzmq: one process sends 64 x 224 x 224 x 3 uint8 frames (9.6 MB) zero-copy over
    loopback TCP to another, which receives them zero-copy (PUSH/PULL, the same frames).
(b) Stoker: senders on core 0 replay a pre-made batch of that size through the worker's
    own send path (lease, lease token, credit, framing: workers.process), with real sample
    ids from each leased unit; one rank on core 1 takes them through all its checks (lease,
    schema, books, plan order) and steps nothing (`--accel null`); with and without
    `--checksum` (crc32 on both sides).
(c) as (b), two ranks (both on core 1: this machine has two cores), aggregate.
Medians of 3 go to benchmarks/results/ingest.{json,md}. Target: (b) >= 0.8 x (a).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import zmq

from accel.accelerators import NullAccelerator
from accel.consumer import Consumer, ConsumerConfig
from accel.job import JobConfig
from stoker.datasets import default_imagenet

RESULTS = Path(__file__).parent / "results"
BATCH, SIZE = 64, 224
FRAME_BYTES = BATCH * SIZE * SIZE * 3
SENDER_CORE, RANK_CORE = 0, 1
SECONDS = 6.0


# ---- (a) raw pyzmq ---------------------------------------------------------------------------
def _raw_sender(endpoint: str, count: int) -> None:
    os.sched_setaffinity(0, {SENDER_CORE})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.connect(endpoint)
    frame = np.zeros(FRAME_BYTES, dtype=np.uint8)
    for _ in range(count):
        sock.send_multipart([b"header", frame], copy=False)
    sock.close(linger=-1)
    ctx.term()


def raw_pyzmq(count: int = 400) -> float:
    os.sched_setaffinity(0, {RANK_CORE})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 4)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sender = mp.get_context("spawn").Process(target=_raw_sender, args=(f"tcp://127.0.0.1:{port}", count))
    sender.start()
    received = 0
    started = None
    for i in range(count):
        frames = sock.recv_multipart(copy=False)
        if i == 10:
            started, received = time.perf_counter(), 0
        received += len(frames[1].buffer)
    elapsed = time.perf_counter() - started
    sender.join()
    sock.close(0)
    ctx.term()
    return received / elapsed / 1e9


# ---- (b), (c) Stoker ---------------------------------------------------------------------------
def _replay_sender(control: str, host: str, seconds: float) -> None:
    """A worker process that makes no batches: it sends one pre-made batch for every batch of every
    unit it leases, through the worker's own send path."""
    os.sched_setaffinity(0, {SENDER_CORE})
    from pipeline.plan import Segment, Unit, batch_bounds
    from protos import stoker_pb2 as pb
    from workers.control_client import ControlClient
    from workers.metrics import WorkerMetrics
    from workers.process import ProcessSpec, _send_batch, _Stop
    from workers.sender import DataSender, Lease
    from workers.sources import Outgoing

    ctx = zmq.Context()
    worker_id = f"{host}/p0.1"
    client = ControlClient(ctx, control, worker_id)
    job = client.request(pb.ControlRequest(register=pb.Register(host_id=host, procs=1))).registered.job
    spec = ProcessSpec(host, worker_id, control, job.SerializeToString(), os.getppid())
    images = np.zeros((BATCH, SIZE, SIZE, 3), dtype=np.uint8)
    labels = np.zeros(BATCH, dtype=np.int32)
    senders: dict[str, DataSender] = {}
    metrics, stop = WorkerMetrics(), _Stop(os.getppid())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reply = client.request(pb.ControlRequest(lease=pb.LeaseRequest(host_id=host, worker_id=worker_id)))
        if reply.WhichOneof("kind") != "unit":
            time.sleep(0.05)
            continue
        w = reply.unit
        unit = Unit(w.unit_id, w.epoch, tuple(Segment(g.shard_index, g.start, g.stop, g.first_sample_id)
                                              for g in w.segments), w.rank, w.position)
        sender = senders.setdefault(w.data_endpoint, DataSender(ctx, w.data_endpoint, host, worker_id, job.job_id))
        sender.start_unit(Lease(w.unit_id, w.lease_token))
        ids = [sample for _, _, sample in unit.rows(job.seed)]
        bounds = batch_bounds(len(ids), job.batch_size)
        for index, (a, b) in enumerate(bounds):
            header = pb.BatchHeader(batch_index=index, last_in_unit=index == len(bounds) - 1, sample_ids=ids[a:b],
                                    rows=b - a)
            batch = Outgoing(header, {"image": images[:b - a], "label": labels[:b - a]}, lambda m: None)
            _send_batch(job, spec, unit, batch, sender, metrics, stop)
    for sender in senders.values():
        sender.close()
    client.close()
    ctx.term()


def stoker_ingest(manifest: str, ranks: int, checksum: bool, senders: int = 2) -> float:
    """GB/s of tensor bytes the ranks took, after the first second."""
    os.sched_setaffinity(0, {RANK_CORE})
    epochs = 1000
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None,
                         credit_window=2)
    job = JobConfig(manifest_uri=manifest, epochs=epochs, batch_size=BATCH, checksum=checksum, world_size=ranks)
    env = {**os.environ, "STOKER_JOB_SECRET": "ab" * 32}
    os.environ["STOKER_JOB_SECRET"] = env["STOKER_JOB_SECRET"]
    zero = Consumer(cfg, job, NullAccelerator())
    zero.start()
    others = [subprocess.Popen(["taskset", "-c", str(RANK_CORE), sys.executable, "-m", "stoker", "train",
                                "--rank", str(r), "--world-size", str(ranks), "--dispatcher", zero.control_endpoint,
                                "--data-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1", "--no-progress",
                                "--max-seconds", str(SECONDS + 1), "--credit-window", "2",
                                "--json", f"/tmp/stoker-ingest-rank{r}.json"], env=env, stdout=subprocess.DEVNULL)
              for r in range(1, ranks)]
    workers = [mp.get_context("spawn").Process(target=_replay_sender, args=(zero.control_endpoint, f"h{i}",
                                                                            SECONDS + 4)) for i in range(senders)]
    for w in workers:
        w.start()
    summary = zero.run(max_seconds=SECONDS + 1)
    rates = [summary.bytes_received / max(summary.elapsed_s - summary.startup_s, 1e-9)]
    for r, proc in enumerate(others, 1):
        proc.wait(60)
        other = json.loads(Path(f"/tmp/stoker-ingest-rank{r}.json").read_text())
        rates.append(other["bytes_received"] / max(other["elapsed_s"] - other["startup_s"], 1e-9))
    for w in workers:
        w.terminate()
        w.join()
    zero.cfg = replace(zero.cfg, rank_wait_s=0.0, finish_linger_s=0.0)
    zero.stop()
    return sum(rates) / 1e9


def main(repeats: int = 3) -> dict:
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("the ingest benchmark needs two cores (senders and rank on separate cores)")
    manifest = str(default_imagenet())
    rows = {"raw": [], "stoker": [], "stoker_checksum": [], "stoker_2_ranks": []}
    for i in range(repeats):
        rows["raw"].append(raw_pyzmq())
        rows["stoker"].append(stoker_ingest(manifest, 1, checksum=False))
        rows["stoker_checksum"].append(stoker_ingest(manifest, 1, checksum=True))
        rows["stoker_2_ranks"].append(stoker_ingest(manifest, 2, checksum=False))
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in rows.items()), flush=True)
    medians = {k: statistics.median(v) for k, v in rows.items()}
    result = {"benchmark": "ingest", "when": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
              "versions": {"pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(), "numpy": np.__version__},
              "frame_bytes": FRAME_BYTES, "gb_per_s": rows, "medians": medians,
              "ratio": medians["stoker"] / medians["raw"],
              "ratio_checksum": medians["stoker_checksum"] / medians["raw"]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ingest.json").write_text(json.dumps(result, indent=1))
    table = ("| 9.6 MB batches (64 x 224 x 224 x 3 uint8), senders on core 0, receiver on core 1 | GB/s, median of 3 "
             "| vs raw pyzmq |\n|---|---|---|\n"
             f"| (a) raw pyzmq PUSH/PULL, zero-copy | {medians['raw']:.2f} | 1.00 |\n"
             f"| (b) Stoker, 1 rank, 2 replaying worker processes | {medians['stoker']:.2f} | {result['ratio']:.2f} |\n"
             f"| (b) with `--checksum` (crc32 both sides) | {medians['stoker_checksum']:.2f} | "
             f"{result['ratio_checksum']:.2f} |\n"
             f"| (c) Stoker, 2 ranks (both on core 1), aggregate | {medians['stoker_2_ranks']:.2f} | "
             f"{medians['stoker_2_ranks'] / medians['raw']:.2f} |\n")
    (RESULTS / "ingest.md").write_text(table)
    print(table)
    return result


if __name__ == "__main__":
    main()
