"""Processes that are not Stoker's workers or consumer, talking to its sockets: for the attack tests."""

from __future__ import annotations

import numpy as np
import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys


def dealer(ctx: zmq.Context, endpoint: str, curve: ClientKeys | None = None, identity: bytes | None = None):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    return sock


def call(sock: zmq.Socket, request: pb.ControlRequest, request_id: int, timeout_s: float = 5.0) -> pb.ControlReply:
    """One control request and its reply (the dispatcher answers even a refusal)."""
    request.request_id = request_id
    sock.send(request.SerializeToString())
    while sock.poll(int(timeout_s * 1000)):
        reply = pb.ControlReply()
        reply.ParseFromString(sock.recv())
        if reply.request_id == request_id:
            return reply
    raise TimeoutError(f"no answer to {request.WhichOneof('kind')}")


def data_replies(sock: zmq.Socket, timeout_s: float = 0.5) -> list[pb.DataReply]:
    out = []
    while sock.poll(int(timeout_s * 1000)):
        reply = pb.DataReply()
        reply.ParseFromString(sock.recv())
        out.append(reply)
        timeout_s = 0.05
    return out


def zero_batch(job_id: str, worker_id: str, unit: pb.WorkUnit, sample_ids: list[int], size: int, last: bool,
               token: bytes, index: int = 0) -> list[bytes]:
    """A well-formed batch of black images that claims real sample ids: what a poisoner would send."""
    images = np.zeros((len(sample_ids), size, size, 3), np.uint8)
    labels = np.zeros(len(sample_ids), np.int32)
    header = pb.BatchHeader(job_id=job_id, worker_id=worker_id, epoch=unit.epoch, unit_id=unit.unit_id,
                            batch_index=index, last_in_unit=last, sample_ids=sample_ids, rows=len(sample_ids),
                            lease_token=token)
    if sample_ids:
        header.frames.add(tensor="image", dtype="|u1", shape=list(images.shape), nbytes=images.nbytes)
        header.frames.add(tensor="label", dtype="<i4", shape=[len(sample_ids)], nbytes=labels.nbytes)
        return [pb.DataMessage(batch=header).SerializeToString(), images.tobytes(), labels.tobytes()]
    return [pb.DataMessage(batch=header).SerializeToString()]


class PixelAudit:
    """An accelerator that records, per stepped sample, whether its image was all black."""

    name = "audit"

    def __init__(self) -> None:
        self.black: list[int] = []
        self.stepped = 0

    def step(self, batch) -> None:
        if not batch.size:
            return
        images = batch.images.reshape(batch.size, -1)
        self.stepped += batch.size
        self.black += [int(i) for i, row in zip(batch.sample_ids, images, strict=True) if not row.any()]
