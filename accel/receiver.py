"""The consumer's data socket: lease checks, credit windows, frame checks, duplicate drops.

Runs on the consumer's event loop. A sender slot (a credit window) is only for a worker
process that proves it holds a lease: its hello echoes the lease token the dispatcher gave
it, and so does every batch, for that batch's unit (protos.leases). A sender may send only
while it holds credit; credit for a batch comes back when the training step has finished
with it, so the memory held on the consumer is bounded by the senders' windows. A slot whose
sender goes silent (it answers no ping for `sender_timeout_s`; waiting for credit is not
silence, a waiting sender answers pings) is freed, and a sender that is gone is forgotten
the first time a reply cannot reach it. Anything malformed, from a peer that holds no slot,
or for a unit the sender does not lease is dropped and counted; it never reaches the
prefetch queue.
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
from accel.ledger import InvalidBatch, Ledger, Skipped, Step
from accel.metrics import ConsumerMetrics
from accel.schema import BatchSchema
from protos import stoker_pb2 as pb
from protos.curve import NOBODY, WORKER, Caller, caller_of
from protos.framing import MAX_FRAMES, FrameError, decode_tensors, frame_bytes, parse_data_message
from protos.leases import LeaseSigner

log = logging.getLogger("stoker.consumer")
MAX_SENDERS = 4096  # credit windows held at once; memory stays bounded however many peers say hello
PING_AFTER_S = 2.0  # a sender silent this long is asked whether it is still there


@dataclass
class _Peer:
    worker_id: str
    host_id: str
    outstanding: int = 0  # credits granted and not yet returned
    heard: float = 0.0  # monotonic time of its last message
    pinged: float = 0.0


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
                 out: queue.Queue, metrics: ConsumerMetrics, on_unit_done: Callable[[int], None],
                 schema: BatchSchema, leases: LeaseSigner, keyed: bool = False,
                 on_unit_incomplete: Callable[[int], None] = lambda unit_id: None,
                 sender_timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.job_id = job_id
        self.schema = schema
        self.window = window
        self.ledger = ledger
        self.out = out
        self.metrics = metrics
        self.on_unit_done = on_unit_done
        self.on_unit_incomplete = on_unit_incomplete
        self.leases = leases
        self.keyed = keyed  # CURVE: senders must be connected with a worker key
        self.sender_timeout_s = sender_timeout_s
        self.clock = clock
        self.peers: dict[bytes, _Peer] = {}
        self._by_worker: dict[str, bytes] = {}  # one slot per worker process, whatever its routing id
        self.stages = StageTotals()
        self.bytes_received = 0
        self.text = TextTotals()
        self.dropped: dict[str, int] = {}
        self.freed: dict[str, int] = {}  # sender slots freed, by why
        self.hosts_delivered: set[str] = set()  # hosts whose batches were admitted

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
        caller = caller_of(body[0]) if self.keyed else NOBODY  # who, by the key its connection proved
        kind = message.WhichOneof("kind")
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.heard = self.clock()
        if kind == "hello":
            self._hello(peer_id, message.hello, caller, extra_frames=len(body) - 1)
        elif kind == "bye":
            if peer is not None:
                self._free(peer_id, "bye")
        elif kind == "pong":
            if peer is None:
                self._drop("unknown_peer", peer_id, "pong from a peer that holds no sender slot")
        else:
            self._batch(peer_id, peer, message.batch, body[1:], caller, started)

    def _proves_lease(self, caller: Caller, token: bytes, unit_id: int, host_id: str, worker_id: str) -> bool:
        if self.keyed and caller.role != WORKER:
            return False
        return self.leases.valid(token, unit_id, host_id, worker_id, caller.name)

    def _hello(self, peer_id: bytes, hello: pb.Hello, caller: Caller, extra_frames: int) -> None:
        if extra_frames:
            self._drop("bad_header", peer_id, "hello with trailing frames")
            return
        if hello.job_id != self.job_id:
            self._reject(peer_id, "wrong_job", f"job {hello.job_id!r} is not {self.job_id!r}")
            self._drop("wrong_job", peer_id, hello.job_id)
            return
        if not self._proves_lease(caller, hello.lease_token, hello.unit_id, hello.host_id, hello.worker_id):
            self._reject(peer_id, "not_leaseholder", f"no lease of unit {hello.unit_id} for {hello.worker_id[:64]!r}",
                         hello.unit_id)
            self._drop("not_leaseholder", peer_id, f"hello for unit {hello.unit_id}")
            return
        earlier = self._by_worker.get(hello.worker_id)
        if earlier is not None and earlier != peer_id:  # the same process, reconnected under a new routing id
            self._free(earlier, "replaced")
        if peer_id not in self.peers and len(self.peers) >= MAX_SENDERS:
            self.sweep()
            if len(self.peers) >= MAX_SENDERS:
                self._drop("too_many_senders", peer_id, f"{len(self.peers)} senders already hold credit")
                return
        peer = self.peers.get(peer_id)
        if peer is None or peer.worker_id != hello.worker_id:
            if peer is not None:
                self._by_worker.pop(peer.worker_id, None)
            peer = self.peers[peer_id] = _Peer(hello.worker_id, hello.host_id, heard=self.clock())
            self._by_worker[hello.worker_id] = peer_id
        self.metrics.senders.set(len(self.peers))
        self._grant(peer_id, self.window - peer.outstanding)

    def _batch(self, peer_id: bytes, peer: _Peer | None, header: pb.BatchHeader, frames: list, caller: Caller,
               started: float) -> None:
        if peer is None:
            self._reject(peer_id, "unknown_sender", "say hello first")
            self._drop("unknown_peer", peer_id, "batch from a peer that holds no sender slot")
            return
        peer.outstanding = max(0, peer.outstanding - 1)
        if header.worker_id != peer.worker_id or not self._proves_lease(
                caller, header.lease_token, header.unit_id, peer.host_id, peer.worker_id):
            self._reject(peer_id, "not_leaseholder", f"no lease of unit {header.unit_id}", header.unit_id)
            self._drop("not_leaseholder", peer_id, f"batch of unit {header.unit_id} from {peer.worker_id!r}")
            self._grant(peer_id, 1)
            return
        try:
            if header.job_id != self.job_id:
                raise FrameError("wrong_job", header.job_id)
            tensors = decode_tensors(header, frames)
            sample_ids = np.asarray(header.sample_ids, dtype=np.int64)
            skipped_ids = np.asarray([s.sample_id for s in header.skipped], dtype=np.int64)
            self.schema.check(header, tensors.parts)
            fresh = self.ledger.admit(header.epoch, header.unit_id, header.batch_index, sample_ids, skipped_ids)
        except (FrameError, InvalidBatch) as exc:
            self._drop(exc.reason, peer_id, str(exc))
            self._grant(peer_id, 1)
            return
        if not fresh:
            self.metrics.duplicates.inc(len(sample_ids))
            self._settled(header.unit_id, self.ledger.settle(header.unit_id))
            self._grant(peer_id, 1)
            return
        self.hosts_delivered.add(peer.host_id)
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
        """Record the step, return the batch's credit, and close its unit when it is complete.

        Samples the step could not use (`batch.undecodable`: decoding on the accelerator failed)
        count as skipped, not delivered."""
        header = batch.header
        skipped = [Skipped(header.epoch, s.sample_id, s.key, s.reason) for s in header.skipped]
        skipped += batch.undecodable
        self.ledger.record_skips(header.epoch, skipped)
        self.metrics.skipped.inc(len(skipped))
        lost = {s.sample_id for s in batch.undecodable}
        used = batch.sample_ids if not lost else batch.sample_ids[[i not in lost for i in batch.sample_ids.tolist()]]
        state = self.ledger.stepped(header.epoch, header.unit_id, header.batch_index, header.last_in_unit, used,
                                    np.asarray([s.sample_id for s in skipped], dtype=np.int64))
        self._settled(header.unit_id, state)
        if batch.peer in self.peers:
            self._grant(batch.peer, 1)
        self.metrics.queue_depth.set(self.out.qsize())

    def _settled(self, unit_id: int, state: Step) -> None:
        if state is Step.DONE:
            self.on_unit_done(unit_id)
        elif state is Step.INCOMPLETE:
            self._drop("incomplete_unit", b"", f"unit {unit_id} ended with samples missing")
            self.on_unit_incomplete(unit_id)

    # ---- sender slots --------------------------------------------------------------------
    def sweep(self) -> None:
        """Ping senders that have been quiet; free the slots of those silent past the timeout."""
        now = self.clock()
        ping_after = min(PING_AFTER_S, self.sender_timeout_s / 3)
        for peer_id, peer in list(self.peers.items()):
            quiet = now - peer.heard
            if quiet > self.sender_timeout_s:
                log.info("sender %s said nothing for %.0f s; freeing its slot", peer.worker_id, quiet)
                self._free(peer_id, "silent")
            elif quiet > ping_after and now - peer.pinged > ping_after:
                peer.pinged = now
                self._reply(peer_id, pb.DataReply(ping=pb.Ping()))

    def _free(self, peer_id: bytes, why: str) -> None:
        peer = self.peers.pop(peer_id, None)
        if peer is None:
            return
        if self._by_worker.get(peer.worker_id) == peer_id:
            del self._by_worker[peer.worker_id]
        self.freed[why] = self.freed.get(why, 0) + 1
        self.metrics.senders_freed.labels(reason=why).inc()
        self.metrics.senders.set(len(self.peers))

    # ---- outgoing ----------------------------------------------------------------------
    def _grant(self, peer_id: bytes, batches: int) -> None:
        if batches <= 0:
            return
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.outstanding += batches
        self._reply(peer_id, pb.DataReply(credit=pb.Credit(batches=batches)))

    def _reject(self, peer_id: bytes, code: str, reason: str, unit_id: int = 0) -> None:
        self._reply(peer_id, pb.DataReply(reject=pb.Reject(reason=reason, code=code, unit_id=unit_id)))

    def _reply(self, peer_id: bytes, reply: pb.DataReply) -> None:
        sent = self.socket.send_multipart([peer_id, reply.SerializeToString()], flags=zmq.NOBLOCK)
        error = send_error(sent)
        if error is not None:  # ROUTER_MANDATORY: the peer is gone, or its queue is full
            if peer_id in self.peers:
                log.info("peer %r unreachable (%s); forgetting it", peer_id, error)
                self._free(peer_id, "unreachable")

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

