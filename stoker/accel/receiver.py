"""The consumer's data socket: lease checks, credit windows, frame checks, duplicate drops.

Runs on the consumer's event loop. A sender slot (a credit window) is only for a worker
process that proves it holds a lease: its hello echoes the lease token the dispatcher gave
it, and so does every batch, for that batch's unit (protos.leases). A sender may send only
while it holds credit; credit for a batch comes back when the training step has finished
with it, so the memory held on the consumer is bounded by the senders' windows. A slot whose
sender goes silent (it answers no ping for `sender_timeout_s`; waiting for credit is not
silence, a waiting sender answers pings) is freed, and the unit it was in the middle of is
leased again (its host may be alive, heartbeating for a process that is frozen or stuck in C
code), instead of waiting for the lease timeout; a sender that is gone is forgotten
the first time a reply cannot reach it. Anything malformed, from a peer that holds no slot,
for a unit the sender does not lease, or for another rank's unit is dropped and counted; it
never reaches the prefetch queue.

A rank's batches leave in plan order (accel.stream); the ones that come early wait ("held").
Memory is bounded per rank by the credit rules (accel.credit), which decide how much every
event lets each sender send. A worker process holds at most one unit per rank and makes their
batches in step order, only for a rank that has granted it credit (workers.process), so a rank
waiting for its own next batch always gets it, whatever another rank, waiting in lock-step,
holds back.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from stoker.accel.batch import ReceivedBatch
from stoker.accel.cost import RateSpread
from stoker.accel.credit import CreditBook, Grant, SenderCredit
from stoker.accel.ledger import InvalidBatch, Ledger, ShortUnit, Skipped, Step
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.schema import BatchSchema
from stoker.accel.stream import EpochEnd, StreamOrder
from stoker.pipeline.units import Unit
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import NOBODY, WORKER, Caller, caller_of
from stoker.protos.droplog import DropLog
from stoker.protos.framing import MAX_FRAMES, FrameError, decode_tensors, frame_bytes, parse_data_message
from stoker.protos.leases import LeaseSigner
from stoker.protos.sockets import send_nowait

log = logging.getLogger("stoker.consumer")
MAX_SENDERS = 4096  # credit windows held at once; memory stays bounded however many peers say hello
PING_AFTER_S = 2.0  # a sender silent this long is asked whether it is still there


@dataclass
class _Peer:
    """A sender slot: who holds it and when it was last heard (its credit is in the CreditBook)."""

    worker_id: str
    host_id: str
    heard: float = 0.0  # monotonic time of its last message
    pinged: float = 0.0


@dataclass
class StageTotals:
    """What the workers' batches reported, added up: stages in CPU seconds, waits in wall seconds
    (protos StageSeconds), and what the consumer saw of them."""

    decode: float = 0.0
    augment: float = 0.0
    read: float = 0.0
    send: float = 0.0
    examples: float = 0.0
    pack: float = 0.0
    cpu: float = 0.0  # the worker processes' whole CPU (stages and all between them)
    wait_for_credit: float = 0.0
    read_wait: float = 0.0  # reads beyond their CPU time: storage
    cpu_wait: float = 0.0  # runnable without a core, over the batches where it was measured
    throttled_wait: float = 0.0  # ... of which in batches made while a cgroup CPU quota throttled them
    cpu_wait_batches: int = 0  # batches whose CPU wait was measured
    host_cpu: dict[str, float] = field(default_factory=dict)  # the whole CPU, by host
    host_cpu_wait: dict[str, float] = field(default_factory=dict)  # the measured wait for a core, by host
    host_cores: dict[str, float] = field(default_factory=dict)  # the cores a host's worker processes may run on
    host_procs: dict[str, int] = field(default_factory=dict)  # the worker processes a host's daemon runs
    host_machine: dict[str, tuple[str, float]] = field(default_factory=dict)  # host -> (machine id, its cores)
    receive: float = 0.0
    transit: float = 0.0  # worker sent -> consumer received, summed over batches (one clock in the lab)
    min_transit: float = float("inf")  # the quickest batch: the link's latency, with nothing queued before it
    batches: int = 0
    per_core: RateSpread = field(default_factory=RateSpread)  # rows per CPU-second, chunk by chunk


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
                 out: queue.Queue, metrics: ConsumerMetrics, on_unit_done: Callable[[int, int], None],
                 schema: BatchSchema, leases: LeaseSigner, order: StreamOrder, keyed: bool = False,
                 on_unit_received: Callable[[int], None] = lambda unit_id: None,
                 on_unit_counted: Callable[[int, int], None] = lambda unit_id, batches: None,
                 on_unit_short: Callable[[int], object] = lambda unit_id: None,
                 on_epoch_end: Callable[[EpochEnd], None] = lambda end: None,
                 sender_timeout_s: float = 30.0, budget: int | None = None,
                 clock: Callable[[], float] = time.monotonic, steps_wait_on_stream: bool = False) -> None:
        self.socket = socket
        self.job_id = job_id
        self.schema = schema
        self.window = window
        self.ledger = ledger
        self.out = out
        self.metrics = metrics
        self.on_unit_done = on_unit_done
        self.on_unit_received = on_unit_received  # all its batches are here: nobody need make it again
        self.on_unit_counted = on_unit_counted  # text: how many batches a unit sends, told with its first
        self.on_unit_short = on_unit_short  # its last batch left samples out: have it made again
        self.on_epoch_end = on_epoch_end  # the rank's whole stream of an epoch is here (its batch count known)
        self.leases = leases
        self.order = order
        self.credit = CreditBook(window, budget or MAX_SENDERS * window,  # what every sender may send
                                 steps_wait_on_stream)
        self._batches_of: dict[int, int] = {}  # unit -> batches it gave, once its last one arrived
        self.keyed = keyed  # CURVE: senders must be connected with a worker key
        self.sender_timeout_s = sender_timeout_s
        self.clock = clock
        self.peers: dict[bytes, _Peer] = {}
        self._by_worker: dict[str, bytes] = {}  # one slot per worker process, whatever its routing id
        self.stages = StageTotals()
        self.bytes_received = 0
        self.text = TextTotals()
        self._drops = DropLog(log, "a message", metrics.frames_dropped)
        self.dropped = self._drops.counts  # by reason, for the summary
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

    def _readmit(self, peer_id: bytes, header: pb.BatchHeader, caller: Caller) -> _Peer | None:
        """A sender whose slot was freed (it had been quiet) is back with a batch its lease proves:
        it is alive after all, so it gets its slot back rather than redoing the unit."""
        if not header.host_id or len(self.peers) >= MAX_SENDERS or self._by_worker.get(header.worker_id):
            return None
        if not self._proves_lease(caller, header.lease_token, header.unit_id, header.host_id, header.worker_id):
            return None
        peer = self.peers[peer_id] = _Peer(header.worker_id, header.host_id, heard=self.clock())
        self.credit.readmit(peer_id)
        self._by_worker[header.worker_id] = peer_id
        self.metrics.senders.set(len(self.peers))
        return peer

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
            self.credit.leave(peer_id)  # another process under this routing id: its credit is not this one's
            peer = self.peers[peer_id] = _Peer(hello.worker_id, hello.host_id, heard=self.clock())
            self._by_worker[hello.worker_id] = peer_id
        self.metrics.senders.set(len(self.peers))
        self._send_credit(self.credit.hello(peer_id, hello.unit_id, self._waiting_for()))

    def _batch(self, peer_id: bytes, peer: _Peer | None, header: pb.BatchHeader, frames: list, caller: Caller,
               started: float) -> None:
        if peer is None:
            peer = self._readmit(peer_id, header, caller)
        if peer is None:
            self._reject(peer_id, "unknown_sender", "say hello first")
            self._drop("unknown_peer", peer_id, "batch from a peer that holds no sender slot")
            return
        self.credit.arrived(peer_id)
        if header.worker_id != peer.worker_id or not self._proves_lease(
                caller, header.lease_token, header.unit_id, peer.host_id, peer.worker_id):
            self._reject(peer_id, "not_leaseholder", f"no lease of unit {header.unit_id}", header.unit_id)
            self._drop("not_leaseholder", peer_id, f"batch of unit {header.unit_id} from {peer.worker_id!r}")
            self._send_credit(self.credit.refused(peer_id))
            return
        unit = self.order.plan.unit(header.unit_id)
        if unit is not None and not self.order.owns(unit):
            self._drop("wrong_rank", peer_id, f"unit {header.unit_id} is rank {unit.rank}'s, this is rank "
                                              f"{self.order.rank}")
            self._send_credit(self.credit.refused(peer_id))
            return
        try:
            if header.job_id != self.job_id:
                raise FrameError("wrong_job", header.job_id)
            tensors = decode_tensors(header, frames)
            sample_ids = np.asarray(header.sample_ids, dtype=np.int64)
            skipped_ids = np.asarray([s.sample_id for s in header.skipped], dtype=np.int64)
            self.schema.check(header, tensors.parts)
            fresh = self.ledger.admit(header.epoch, header.unit_id, header.batch_index, sample_ids, skipped_ids,
                                      header.last_in_unit, np.asarray(header.stepped_before, dtype=np.int64))
        except (FrameError, InvalidBatch) as exc:
            self._drop(exc.reason, peer_id, str(exc))
            self._send_credit(self.credit.refused(peer_id))
            if isinstance(exc, ShortUnit):
                self.on_unit_short(header.unit_id)
            return
        if not fresh:
            self.metrics.duplicates.inc(len(sample_ids))
            self._send_credit(self.credit.refused(peer_id))
            return
        if header.batch_index == 0 and header.unit_batches:
            self.on_unit_counted(header.unit_id, header.unit_batches)
        if self.ledger.received(header.unit_id):
            self.on_unit_received(header.unit_id)
        self.credit.admitted(peer_id, header.unit_id, header.last_in_unit)
        if header.last_in_unit:
            self._batches_of[header.unit_id] = header.batch_index + 1
        self._account(peer, header, tensors.nbytes, len(sample_ids))
        received_s = time.perf_counter() - started
        self.stages.receive += received_s
        batch = ReceivedBatch(peer_id, header, tensors, sample_ids, received_s)
        assert unit is not None, "the ledger admitted the batch, so its unit is in the plan"
        self._offer_in_order(unit, batch)
        self.metrics.queue_depth.set(self.out.qsize())
        self._send_credit(self.credit.after_arrival(peer_id, self._waiting_for()))

    def _account(self, peer: _Peer, header: pb.BatchHeader, nbytes: int, samples: int) -> None:
        """What a new batch tells the books: its host, bytes, rows, the workers' stage times, text stats."""
        self.hosts_delivered.add(peer.host_id)
        self.metrics.bytes_received.inc(nbytes)
        self.metrics.host_rows.labels(host=peer.host_id).inc(header.rows or samples)
        self.metrics.host_credit_wait.labels(host=peer.host_id).inc(header.stages.wait_for_credit)
        self.bytes_received += nbytes
        stages, totals = header.stages, self.stages
        for name in ("decode", "augment", "read", "send", "examples", "pack", "cpu", "wait_for_credit", "read_wait"):
            setattr(totals, name, getattr(totals, name) + getattr(stages, name))
        if stages.cpu_wait_measured:
            totals.cpu_wait += stages.cpu_wait
            totals.cpu_wait_batches += 1
            if stages.throttled:
                totals.throttled_wait += stages.cpu_wait
            self.metrics.host_cpu_wait.labels(host=peer.host_id).inc(stages.cpu_wait)
            totals.host_cpu_wait[peer.host_id] = totals.host_cpu_wait.get(peer.host_id, 0.0) + stages.cpu_wait
        self.metrics.host_cpu.labels(host=peer.host_id).inc(stages.cpu)
        totals.host_cpu[peer.host_id] = totals.host_cpu.get(peer.host_id, 0.0) + stages.cpu
        if stages.cores > 0 and stages.processes > 0:
            totals.host_cores[peer.host_id], totals.host_procs[peer.host_id] = stages.cores, stages.processes
            totals.host_machine[peer.host_id] = (stages.machine or peer.host_id, stages.machine_cores or stages.cores)
        totals.per_core.add(header.rows or samples, stages.cpu)
        if header.created_unix:
            transit = time.time() - header.created_unix  # one clock in the lab; elsewhere the hosts' offset too
            self.stages.transit += max(0.0, transit)
            self.stages.min_transit = min(self.stages.min_transit, transit)
        self.stages.batches += 1
        if header.HasField("text"):
            self.text.add(header.text)
            self.metrics.padding.labels(packing="before").set(self.text.padding_fraction_before_packing)
            self.metrics.padding.labels(packing="after").set(self.text.padding_fraction)

    def _offer_in_order(self, unit: Unit, batch: ReceivedBatch) -> None:
        """Queue the batch in its place in the rank's stream: it and any batches it unblocks go out."""
        header = batch.header
        for released in self.order.offer(unit, header.batch_index, header.last_in_unit, batch):
            if isinstance(released, ReceivedBatch):
                self.credit.released(released.peer, released.header.unit_id)
            else:
                self.on_epoch_end(released)
            self.out.put(released)  # a batch, or the EpochEnd after a rank's last batch of an epoch

    # ---- after the step ----------------------------------------------------------------
    def step_done(self, batch: ReceivedBatch, replayed: bool = False) -> None:
        """Record the step, return the batch's credit, and close its unit when it is complete.

        Samples the step could not use (`batch.undecodable`: decoding on the accelerator failed)
        count as skipped, not delivered. `replayed`: stepped before the resume this run continues
        (accounted for, not delivered again)."""
        header = batch.header
        skipped = [Skipped(header.epoch, s.sample_id, s.key, s.reason) for s in header.skipped]
        skipped += batch.undecodable
        self.ledger.record_skips(header.epoch, skipped)
        self.metrics.skipped.inc(len(skipped))
        lost = {s.sample_id for s in batch.undecodable}
        used = batch.sample_ids if not lost else batch.sample_ids[[i not in lost for i in batch.sample_ids.tolist()]]
        state = self.ledger.stepped(header.epoch, header.unit_id, header.batch_index, header.last_in_unit, used,
                                    np.asarray([s.sample_id for s in skipped], dtype=np.int64), replayed)
        if state is not Step.OPEN:
            if state is Step.INCOMPLETE:
                self._drop("incomplete_unit", b"", f"unit {header.unit_id} ended with samples missing")
            self.credit.unit_done(header.unit_id)
            self.on_unit_done(header.unit_id, self._batches_of.pop(header.unit_id, header.batch_index + 1))
        self._send_credit(self.credit.stepped(batch.peer, self._waiting_for()))
        self.metrics.queue_depth.set(self.out.qsize())

    def _waiting_for(self) -> int | None:
        """The unit whose batch the rank waits for."""
        unit = self.order.next_unit()
        return None if unit is None else unit.unit_id

    # ---- sender slots --------------------------------------------------------------------
    def sweep(self) -> None:
        """Ping senders that have been quiet; free the slots of those that let a ping go unanswered
        until they had been silent for the whole timeout."""
        now = self.clock()
        ping_after = min(PING_AFTER_S, self.sender_timeout_s / 3)
        for peer_id, peer in list(self.peers.items()):
            quiet = now - peer.heard
            unanswered = peer.pinged > peer.heard and now - peer.pinged >= ping_after
            if quiet > self.sender_timeout_s and unanswered:
                log.info("sender %s said nothing for %.0f s; freeing its slot", peer.worker_id, quiet)
                credit = self._free(peer_id, "silent")
                if credit is not None and credit.unit >= 0 and not credit.unit_complete:  # a frozen or stuck
                    log.warning("sender %s of host %s went silent %.0f s ago in the middle of unit %d (a frozen or "
                                "stuck process); leasing the unit again", peer.worker_id, peer.host_id, quiet,
                                credit.unit)  # process: its host lives on
                    self.on_unit_short(credit.unit)
            elif quiet > ping_after and peer.pinged <= peer.heard:
                peer.pinged = now
                self._reply(peer_id, pb.DataReply(ping=pb.Ping()))

    @property
    def sweep_every_s(self) -> float:
        return min(1.0, self.sender_timeout_s / 4)

    def _free(self, peer_id: bytes, why: str) -> SenderCredit | None:
        """Free a sender slot; what its sender had in hand (None for a peer that held none)."""
        peer = self.peers.pop(peer_id, None)
        if peer is None:
            return None
        credit = self.credit.leave(peer_id)
        self._send_credit(self.credit.after_leave(self._waiting_for()))
        if self._by_worker.get(peer.worker_id) == peer_id:
            del self._by_worker[peer.worker_id]
        self.freed[why] = self.freed.get(why, 0) + 1
        self.metrics.senders_freed.labels(reason=why).inc()
        self.metrics.senders.set(len(self.peers))
        return credit

    # ---- outgoing ----------------------------------------------------------------------
    def _send_credit(self, grants: list[Grant]) -> None:
        for peer_id, batches in grants:
            assert isinstance(peer_id, bytes)
            self._reply(peer_id, pb.DataReply(credit=pb.Credit(batches=batches)))

    def _reject(self, peer_id: bytes, code: str, reason: str, unit_id: int = 0) -> None:
        self._reply(peer_id, pb.DataReply(reject=pb.Reject(reason=reason, code=code, unit_id=unit_id)))

    def _reply(self, peer_id: bytes, reply: pb.DataReply) -> None:
        error = send_nowait(self.socket, [peer_id, reply.SerializeToString()])
        if error is not None:  # ROUTER_MANDATORY: the peer is gone, or its queue is full
            if peer_id in self.peers:
                log.info("peer %r unreachable (%s); forgetting it", peer_id, error)
                self._free(peer_id, "unreachable")

    def _drop(self, reason: str, peer_id: bytes, detail: str) -> None:
        self._drops(reason, peer_id, detail)
