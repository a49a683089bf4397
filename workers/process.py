"""One decode/augment process: lease a unit, build its batches, send each under credit.

SIGINT is ignored (the daemon coordinates shutdown); SIGTERM means drain: finish the batch
in hand, say goodbye to the consumer and exit 0. The daemon hands unfinished units back.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass

import zmq

from pipeline.augment import EvalTransform, TrainTransform, Transform
from pipeline.batching import ImageBatch, unit_batches
from pipeline.plan import Unit
from pipeline.shards import Manifest, ShardReader
from protos import stoker_pb2 as pb
from protos.framing import encode_tensors
from workers.control_client import ControlClient, DispatcherUnreachable
from workers.metrics import WorkerMetrics
from workers.sender import DataSender, Rejected

log = logging.getLogger("stoker.worker")

EXIT_FINISHED = 0
EXIT_DISPATCHER_LOST = 3
EXIT_REJECTED = 4


@dataclass(frozen=True)
class ProcessSpec:
    host_id: str
    worker_id: str
    control_endpoint: str
    job: bytes  # serialized pb.JobSpec


def transform_of(job: pb.JobSpec) -> Transform:
    if job.transform == "eval":
        return EvalTransform(size=job.image_size)
    return TrainTransform(size=job.image_size, min_area=job.min_area, max_area=job.max_area)


class _Stop:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested


def build_header(job: pb.JobSpec, worker_id: str, unit: Unit, batch: ImageBatch) -> pb.BatchHeader:
    header = pb.BatchHeader(job_id=job.job_id, worker_id=worker_id, epoch=unit.epoch, unit_id=unit.unit_id,
                            batch_index=batch.batch_index, last_in_unit=batch.last, sample_ids=batch.sample_ids)
    for sample_id, key, reason in batch.skipped:
        header.skipped.add(sample_id=sample_id, key=key, reason=reason[:200])
    header.stages.decode = batch.decode_s
    header.stages.augment = batch.augment_s
    return header


def run_process(spec: ProcessSpec) -> int:
    """The child's main loop; returns its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = _Stop()
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "requested", True))
    job = pb.JobSpec()
    job.ParseFromString(spec.job)
    metrics = WorkerMetrics()
    metrics.processes.inc()
    manifest = Manifest.load(job.manifest_uri)
    readers: dict[int, ShardReader] = {}
    transform = transform_of(job)
    ctx = zmq.Context()
    control = ControlClient(ctx, spec.control_endpoint, spec.worker_id)
    sender = DataSender(ctx, job.data_endpoint, spec.worker_id, job.job_id)
    try:
        while not stop():
            reply = control.request(pb.ControlRequest(
                lease=pb.LeaseRequest(host_id=spec.host_id, worker_id=spec.worker_id)), should_stop=stop)
            kind = reply.WhichOneof("kind")
            if kind == "finished":
                return EXIT_FINISHED
            if kind == "wait":
                time.sleep(reply.wait.retry_after_s)
                continue
            if kind != "unit":
                raise RuntimeError(f"unexpected reply to a lease request: {reply}")
            w = reply.unit
            unit = Unit(w.unit_id, w.epoch, w.shard_index, w.start, w.stop, w.first_sample_id)
            if unit.shard_index not in readers:
                readers[unit.shard_index] = ShardReader(manifest.shard_uri(unit.shard_index))
            for batch in unit_batches(readers[unit.shard_index], unit, transform, job.batch_size, job.seed):
                _send_batch(job, spec, unit, batch, sender, metrics, stop)
                if stop():
                    break
            else:
                metrics.units.inc()
        return EXIT_FINISHED
    except DispatcherUnreachable as exc:
        if stop():
            return EXIT_FINISHED
        log.error("%s: %s", spec.worker_id, exc)
        return EXIT_DISPATCHER_LOST
    except Rejected as exc:
        log.error("%s: %s", spec.worker_id, exc)
        return EXIT_REJECTED
    finally:
        metrics.processes.dec()
        sender.close()
        control.close()
        ctx.term()


def _send_batch(job: pb.JobSpec, spec: ProcessSpec, unit: Unit, batch: ImageBatch, sender: DataSender,
                metrics: WorkerMetrics, stop: _Stop) -> None:
    framing_from = time.perf_counter()
    header = build_header(job, spec.worker_id, unit, batch)
    tensors = {"image": batch.images, "label": batch.labels} if batch.sample_ids else {}
    frames = encode_tensors(header, tensors, checksum=job.checksum)
    send_s = time.perf_counter() - framing_from
    waited = sender.wait_for_credit(stop)
    if sender.credit <= 0:  # stopped while waiting
        return
    header.stages.wait_for_credit = waited
    header.stages.send = send_s
    header.created_unix = time.time()
    nbytes = sender.send(header, frames)
    metrics.credit_wait.inc(waited)
    metrics.batches.inc()
    metrics.samples.inc(len(batch.sample_ids))
    metrics.decode_errors.inc(len(batch.skipped))
    metrics.bytes_sent.inc(nbytes)
    for seconds in batch.decode_times:
        metrics.decode_seconds.observe(seconds)
    for seconds in batch.augment_times:
        metrics.augment_seconds.observe(seconds)


def process_main(spec: ProcessSpec) -> None:
    """multiprocessing target: exit with run_process's code."""
    raise SystemExit(run_process(spec))
