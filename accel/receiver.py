"""The consumer's data socket: credit windows, frame checks, duplicate drops.

Runs on the consumer's event loop. A sender may send only while it holds credit; credit for
a batch comes back when the training step has finished with it, so the memory held on the
consumer is bounded by the senders' windows. Anything malformed or from a peer that never
said hello is dropped and counted; it never reaches the prefetch queue.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from accel.batch import ReceivedBatch
from accel.ledger import InvalidBatch, Ledger, Skipped
from accel.metrics import ConsumerMetrics
from accel.schema import BatchSchema
from protos import stoker_pb2 as pb
from protos.framing import MAX_FRAMES, FrameError, decode_tensors, frame_bytes, parse_data_message

log = logging.getLogger("stoker.consumer")
MAX_SENDERS = 4096  # credit windows held at once; memory stays bounded however many peers say hello


@dataclass
class _Peer:
    worker_id: str
    outstanding: int = 0  # credits granted and not yet returned


@dataclass
class StageTotals:
    decode: float = 0.0
    augment: float = 0.0
    send: float = 0.0
    wait_for_credit: float = 0.0
    examples: float = 0.0
    pack: float = 0.0
    receive: float = 0.0
    transit: float = 0.0  # worker sent -> consumer received, summed over batches (one clock in the lab)
    batches: int = 0


@dataclass
class TextTotals:
    """Token accounting of admitted text batches (padding before/after packing)."""

    sequences: int = 0
    real_tokens: int = 0
    token_slots: int = 0
    unpacked_token_slots: int = 0
    masked_tokens: int = 0
    random_next: int = 0

    def add(self, stats: pb.TextStats) -> None:
        self.sequences += stats.sequences
        self.real_tokens += stats.real_tokens
        self.token_slots += stats.token_slots
        self.unpacked_token_slots += stats.unpacked_token_slots
        self.masked_tokens += stats.masked_tokens
        self.random_next += stats.random_next

    @property
    def padding_fraction(self) -> float:
        return 1 - self.real_tokens / self.token_slots if self.token_slots else 0.0

    @property
    def padding_fraction_before_packing(self) -> float:
        return 1 - self.real_tokens / self.unpacked_token_slots if self.unpacked_token_slots else 0.0


class Receiver:
    def __init__(self, socket: zmq.Socket, job_id: str, window: int, ledger: Ledger,
                 out: queue.Queue, metrics: ConsumerMetrics,
                 on_unit_done: Callable[[int], None], schema: BatchSchema) -> None:
        self.socket = socket
        self.job_id = job_id
        self.schema = schema
        self.window = window
        self.ledger = ledger
        self.out = out
        self.metrics = metrics
        self.on_unit_done = on_unit_done
        self.peers: dict[bytes, _Peer] = {}
        self.stages = StageTotals()
        self.bytes_received = 0
        self.text = TextTotals()
        self.dropped: dict[str, int] = {}

    # ---- incoming -----------------------------------------------------------------------
    def handle(self, frames: list) -> None:
        started = time.perf_counter()
        peer_id = frame_bytes(frames[0])
        body = frames[1:]
        if not body:
            self._drop("empty", peer_id, "no frames after the routing id")
            return
        if len(body) > MAX_FRAMES + 1:
            self._drop("frame_count", peer_id, f"{len(body)} frames")
            return
        try:
            message = parse_data_message(body[0])
        except FrameError as exc:
            self._drop(exc.reason, peer_id, str(exc))
            return
        kind = message.WhichOneof("kind")
        if kind == "hello":
            self._hello(peer_id, message.hello, extra_frames=len(body) - 1)
        elif kind == "bye":
            self.peers.pop(peer_id, None)
            self.metrics.senders.set(len(self.peers))
        else:
            self._batch(peer_id, message.batch, body[1:], started)

    def _hello(self, peer_id: bytes, hello: pb.Hello, extra_frames: int) -> None:
        if extra_frames:
            self._drop("bad_header", peer_id, "hello with trailing frames")
            return
        if hello.job_id != self.job_id:
            self._reply(peer_id, pb.DataReply(reject=pb.Reject(reason=f"job {hello.job_id!r} is not {self.job_id!r}")))
            self._drop("wrong_job", peer_id, hello.job_id)
            return
        if peer_id not in self.peers and len(self.peers) >= MAX_SENDERS:
            self._drop("too_many_senders", peer_id, f"{len(self.peers)} senders already hold credit")
            return
        peer = self.peers.setdefault(peer_id, _Peer(hello.worker_id[:256]))
        self.metrics.senders.set(len(self.peers))
        self._grant(peer_id, self.window - peer.outstanding)

    def _batch(self, peer_id: bytes, header: pb.BatchHeader, frames: list, started: float) -> None:
        peer = self.peers.get(peer_id)
        if peer is None:
            self._drop("unknown_peer", peer_id, "batch from a peer that never said hello")
            return
        peer.outstanding = max(0, peer.outstanding - 1)
        try:
            if header.job_id != self.job_id:
                raise FrameError("wrong_job", header.job_id)
            tensors = decode_tensors(header, frames)
            sample_ids = np.asarray(header.sample_ids, dtype=np.int64)
            self.schema.check(header, tensors.parts)
            fresh = self.ledger.admit(header.epoch, header.unit_id, header.batch_index, sample_ids)
        except (FrameError, InvalidBatch) as exc:
            self._drop(getattr(exc, "reason", "bad_accounting"), peer_id, str(exc))
            self._grant(peer_id, 1)
            return
        if not fresh:
            self.metrics.duplicates.inc(len(sample_ids))
            self._grant(peer_id, 1)
            return
        self.ledger.record_skips(header.epoch, [Skipped(header.epoch, s.sample_id, s.key, s.reason)
                                               for s in header.skipped])
        self.metrics.skipped.inc(len(header.skipped))
        self.metrics.bytes_received.inc(tensors.nbytes)
        self.bytes_received += tensors.nbytes
        stages = header.stages
        self.stages.decode += stages.decode
        self.stages.augment += stages.augment
        self.stages.send += stages.send
        self.stages.wait_for_credit += stages.wait_for_credit
        self.stages.examples += stages.examples
        self.stages.pack += stages.pack
        self.stages.transit += max(0.0, time.time() - header.created_unix) if header.created_unix else 0.0
        self.stages.batches += 1
        if header.HasField("text"):
            self.text.add(header.text)
            self.metrics.padding.labels(packing="before").set(self.text.padding_fraction_before_packing)
            self.metrics.padding.labels(packing="after").set(self.text.padding_fraction)
        received_s = time.perf_counter() - started
        self.stages.receive += received_s
        self.out.put(ReceivedBatch(peer_id, header, tensors, sample_ids, received_s))
        self.metrics.queue_depth.set(self.out.qsize())

    # ---- after the step ----------------------------------------------------------------
    def step_done(self, batch: ReceivedBatch) -> None:
        """Return the batch's credit and close its unit when that was the unit's last step."""
        header = batch.header
        if self.ledger.stepped(header.epoch, header.unit_id, header.batch_index, header.last_in_unit,
                               batch.sample_ids):
            self.on_unit_done(header.unit_id)
        if batch.peer in self.peers:
            self._grant(batch.peer, 1)
        self.metrics.queue_depth.set(self.out.qsize())

    # ---- outgoing ----------------------------------------------------------------------
    def _grant(self, peer_id: bytes, batches: int) -> None:
        if batches <= 0:
            return
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.outstanding += batches
        self._reply(peer_id, pb.DataReply(credit=pb.Credit(batches=batches)))

    def _reply(self, peer_id: bytes, reply: pb.DataReply) -> None:
        sent = self.socket.send_multipart([peer_id, reply.SerializeToString()], flags=zmq.NOBLOCK)
        error = send_error(sent)
        if error is not None:  # ROUTER_MANDATORY: the peer is gone, or its queue is full
            log.info("peer %r unreachable (%s); forgetting it", peer_id, error)
            if self.peers.pop(peer_id, None) is not None:
                self.metrics.senders.set(len(self.peers))

    def _drop(self, reason: str, peer_id: bytes, detail: str) -> None:
        count = self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.metrics.frames_dropped.labels(reason=reason).inc()
        if count <= 3 or count % 1000 == 0:  # a flood of junk must not become a flood of logs
            log.warning("dropped a message from %r: %s (%s); %d so far", peer_id, reason, detail[:200], count)


def send_error(sent: object) -> BaseException | None:
    """The error of a non-blocking send, from a plain socket (None) or an asyncio future."""
    if hasattr(sent, "done") and sent.done():
        return sent.exception()
    return None

