"""Ingest ceiling of a rank: how fast it takes batches when nothing decodes them, against raw pyzmq.

(a) raw pyzmq: one process sends 64 x 224 x 224 x 3 uint8 frames (9.6 MB) zero-copy over
    loopback TCP to another, which receives them zero-copy (PUSH/PULL, the same frames).
(b) Stoker: senders on core 0 replay a pre-made batch of that size through the worker's
    own send path (lease, lease token, credit, framing: workers.process), with real sample
    ids from each leased unit; one rank (`stoker train --accel null`) on core 1 takes them
    through all its checks (lease, schema, books, plan order) and steps nothing; with and
    without `--checksum` (CRC-32C on both sides). Rates are read from the ranks' /metrics.
(c) as (b), two ranks (both on core 1: this machine has two cores), aggregate.
Medians of 3 go to benchmarks/results/ingest.{json,md}. Target: (b) >= 0.8 x (a).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np
import zmq
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import free_port
from benchmarks.report import header, write_results
from stoker.datasets import default_imagenet

BATCH, SIZE = 64, 224
FRAME_BYTES = BATCH * SIZE * SIZE * 3
SENDER_CORE, RANK_CORE = 0, 1
SECONDS = 6.0
WINDOW = 3  # batches in flight per sender: the CLI default
SENDERS = 4  # replaying worker processes, all on the sender core


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
    from stoker.pipeline.units import Segment, Unit, batch_bounds
    from stoker.protos import stoker_pb2 as pb
    from stoker.protos.control_client import ControlClient
    from stoker.workers.metrics import WorkerMetrics
    from stoker.workers.process import ProcessSpec, _send_batch, _Stop
    from stoker.workers.sender import DataSender, Lease
    from stoker.workers.sources import Outgoing

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


def _bytes_received(port: int) -> float:
    """The rank's `stoker_consumer_bytes_received_total`, scraped from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "stoker_consumer_bytes_received":
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    return 0.0


def stoker_ingest(manifest: str, ranks: int, checksum: bool, senders: int = SENDERS) -> float:
    """GB/s of tensor bytes the ranks took together over SECONDS, once every rank was receiving.

    Every rank is a `stoker train` process (rank 0 runs the dispatcher) pinned to the rank core,
    measured by scraping its /metrics while all of them run, so no rank's start-up or finish
    skews another's window."""
    control = free_port()
    metrics = [free_port() for _ in range(ranks)]
    env = {**os.environ, "STOKER_JOB_SECRET": "ab" * 32}
    common = ["--world-size", str(ranks), "--data-bind", "tcp://127.0.0.1:0", "--no-progress", "--accel", "null",
              "--credit-window", str(WINDOW)]
    job = ["--data", manifest, "--epochs", "1000", "--batch-size", str(BATCH), "--control-bind",
           f"tcp://127.0.0.1:{control}", *(["--checksum"] if checksum else [])]
    procs = [subprocess.Popen(["taskset", "-c", str(RANK_CORE), sys.executable, "-m", "stoker", "train",
                               *(job if r == 0 else ["--rank", str(r), "--dispatcher",
                                                     f"tcp://127.0.0.1:{control}"]),
                               *common, "--metrics-port", str(metrics[r])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in range(ranks)]
    workers = [mp.get_context("spawn").Process(target=_replay_sender, args=(f"tcp://127.0.0.1:{control}", f"h{i}",
                                                                            600.0)) for i in range(senders)]
    try:
        deadline = time.monotonic() + 90
        for w in workers:
            while True:  # the dispatcher must be up before a sender registers
                try:
                    _bytes_received(metrics[0])
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("rank 0 did not come up") from None
                    time.sleep(0.2)
            w.start()
        for port in metrics:
            while True:
                try:
                    if _bytes_received(port) > 0:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"a rank (metrics :{port}) received nothing in 90 s")
                time.sleep(0.2)
        time.sleep(1.0)
        before, t0 = [_bytes_received(p) for p in metrics], time.perf_counter()
        time.sleep(SECONDS)
        after, t1 = [_bytes_received(p) for p in metrics], time.perf_counter()
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join()
        for proc in procs:
            proc.kill()
            proc.wait()
    return (sum(after) - sum(before)) / (t1 - t0) / 1e9


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
    result = {**header("ingest", "crc32c"),
              "frame_bytes": FRAME_BYTES, "gb_per_s": rows, "medians": medians,
              "ratio": medians["stoker"] / medians["raw"],
              "ratio_checksum": medians["stoker_checksum"] / medians["raw"]}
    table = ("| 9.6 MB batches (64 x 224 x 224 x 3 uint8), senders on core 0, receiver on core 1 | GB/s, median of 3 "
             "| vs raw pyzmq |\n|---|---|---|\n"
             f"| (a) raw pyzmq PUSH/PULL, zero-copy | {medians['raw']:.2f} | 1.00 |\n"
             f"| (b) Stoker, 1 rank, {SENDERS} replaying worker processes, credit window {WINDOW} | "
             f"{medians['stoker']:.2f} | {result['ratio']:.2f} |\n"
             f"| (b) with `--checksum` (CRC-32C both sides) | {medians['stoker_checksum']:.2f} | "
             f"{result['ratio_checksum']:.2f} |\n"
             f"| (c) Stoker, 2 ranks (both on core 1), aggregate | {medians['stoker_2_ranks']:.2f} | "
             f"{medians['stoker_2_ranks'] / medians['raw']:.2f} |\n")
    write_results("ingest", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
