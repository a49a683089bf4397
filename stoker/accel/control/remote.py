"""A consumer rank's link to a dispatcher in another process (`stoker dispatch`, or rank 0's).

The rank attaches once to get the job and the key its lease tokens are checked with (`attach`),
then, from its event loop, attaches again with its data endpoint (so the dispatcher leases its
units), acks completed units, says it is alive, and asks what only the dispatcher knows: how
many steps an epoch has on every rank, and where every rank stands. Everything proves the
consumer role: with CURVE keys by its consumer key, without by the job credential. Requests
are retried (on a fresh socket, re-attaching) until the dispatcher answers, so a dispatcher
that restarts from its journal loses no ack; an ack it already holds is harmless.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import zmq
import zmq.asyncio

from stoker.accel.control.dispatcher import DispatcherStats
from stoker.accel.control.failures import dispatcher_gone_line
from stoker.accel.control.fleet_member import NOT_MEASURED, Need, need_to_proto
from stoker.accel.control.link import CloseWait
from stoker.accel.control.progress import RankPositions
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient, DispatcherUnreachable
from stoker.protos.curve import ClientKeys
from stoker.protos.errors import PeerError
from stoker.protos.sockets import CONTROL_MESSAGE_BYTES, dealer, end_context

log = logging.getLogger("stoker.consumer")
HEARTBEAT_S = 1.0
RANK_TAKEN = "is already taken by consumer"  # accel.control.dispatcher's refusal of a held rank
_HOLDER_SILENT = re.compile(r"heard from ([0-9.]+) s ago")
STALL_SAY_EVERY_S = 60.0


class NotAConsumer(PeerError, PermissionError):
    """The dispatcher does not accept us as the job's consumer (wrong key or job secret)."""


class RankRefused(PeerError, ValueError):
    """The dispatcher will not give us this rank (taken, out of range, another world size)."""


def _attach_once(endpoint: str, consumer_id: str, curve: ClientKeys | None, credential: bytes, timeout_s: float,
                 rank: int, world_size: int) -> pb.ControlReply:
    ctx = zmq.Context()
    client = ControlClient(ctx, endpoint, consumer_id, curve=curve)
    try:
        return client.request(pb.ControlRequest(attach=pb.Attach(consumer_id=consumer_id, rank=rank,
                                                                 world_size=world_size),
                                                job_credential=credential), give_up_after_s=timeout_s)
    except DispatcherUnreachable as exc:
        raise PeerError(f"no dispatcher at {endpoint}: {exc}") from exc
    finally:
        client.close()
        end_context(ctx)


class _Reattach(Exception):
    """The dispatcher does not know this connection (it restarted): attach again."""


def attach(endpoint: str, consumer_id: str, curve: ClientKeys | None, credential: bytes = b"",
           timeout_s: float = 60.0, rank: int = 0, world_size: int = 0) -> tuple[pb.JobSpec, bytes]:
    """Ask the dispatcher for its job and lease key (retrying while it starts). A rank still held by the
    consumer before this one (it crashed moments ago and the job was started again at once) is asked
    for again until that consumer has been silent for the dispatcher's host timeout, up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    silent_before: tuple[float, float] | None = None  # (when asked, the holder's silence then)
    while True:
        reply = _attach_once(endpoint, consumer_id, curve, credential, max(1.0, deadline - time.monotonic()), rank,
                             world_size)
        message = reply.error.message if reply.WhichOneof("kind") == "error" else ""
        silent = _HOLDER_SILENT.search(message) if RANK_TAKEN in message else None
        if silent is None or time.monotonic() >= deadline:
            break
        now, seconds = time.monotonic(), float(silent[1])
        if silent_before is not None and seconds < silent_before[1] + (now - silent_before[0]) - 1.0:
            break  # heard from again meanwhile: the holder lives
        if silent_before is None:
            log.warning("rank %d: %s; waiting for it to fall silent (a run that crashed moments ago?)", rank, message)
            silent_before = (now, seconds)
        time.sleep(1.5)
    if message:
        if message.startswith("only the job's consumer"):
            raise NotAConsumer(f"the dispatcher at {endpoint} refused to attach this consumer: {message}")
        raise RankRefused(f"the dispatcher at {endpoint} refused rank {rank}: {message}")
    if reply.WhichOneof("kind") != "attached":
        raise PeerError(f"the dispatcher at {endpoint} did not give a job: {reply}")
    return reply.attached.job, reply.attached.lease_key


class RemoteDispatcher:
    """A dispatcher in another process, as a rank sees it (accel.control.link.DispatcherLink)."""

    def __init__(self, endpoint: str, consumer_id: str, total_units: int, curve: ClientKeys | None,
                 credential: bytes = b"", done_before: frozenset[int] = frozenset(), rank: int = 0,
                 world_size: int = 1, linger_s: float = 3.0, start: pb.StartPosition | None = None,
                 give_up_s: float = 0.0) -> None:
        """`total_units`: this rank's units of the whole job; `linger_s`: how long a closing rank
        waits for its last acks to reach the dispatcher; `give_up_s`: after the dispatcher has not
        answered this long (--stall-timeout; 0: never), the job fails here (rank 0 died, or the
        `stoker dispatch` process): only the dispatcher watches for stalls, so without this a rank
        whose dispatcher is gone would wait for ever."""
        self.endpoint = endpoint
        self.consumer_id = consumer_id
        self.total_units = total_units  # this rank's units of the whole job
        self.curve = curve
        self.credential = credential
        self.rank = rank
        self.world_size = world_size
        self.linger_s = linger_s
        self.give_up_s = give_up_s
        self._gave_up = False
        # where this rank starts, told with its first attach only: the dispatcher takes back what it counts done
        # past it. A re-attach (the dispatcher restarted from its journal, this consumer lives on) says nothing:
        # what the journal holds as done, this consumer stepped
        self.start: pb.StartPosition | None = start or pb.StartPosition()
        self.data_endpoint = ""  # set once the rank's data socket is bound
        self._acked: set[int] = set(done_before)
        self._unsent: dict[int, int] = {}  # unit -> its batches
        self._received: set[int] = set()  # units whose batches are all here, to tell
        self._counted: dict[int, int] = {}  # text units whose first batch is here -> their batches, to tell
        self._redo: set[int] = set()  # units whose leaseholder ended them short, to have made again
        self.finished = False  # every unit of the job is done (the dispatcher said so)
        self.on_failure: Callable[[str], None] = lambda reason: None  # the dispatcher says the job failed
        self.waited_s: Callable[[], float] = lambda: 0.0  # how long the rank has waited for a batch
        self.need: Callable[[], Need] = lambda: NOT_MEASURED  # what the rank measures: its acks carry it
        self._stall_said_at = 0.0  # loop time the dispatcher's stall line was last logged here
        self._ids = itertools.count(secrets.randbits(40) + 1)  # its own: a reused identity gets no other's cache
        self._sock: zmq.asyncio.Socket | None = None
        self._in_flight = 0
        self._lock: asyncio.Lock | None = None
        self._job_stats = DispatcherStats(pending=0, leased=0, done=0, hosts_alive=0, releases=0)

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        self._unsent[unit_id] = batches or 0
        return True

    def received(self, unit_id: int) -> None:
        self._received.add(unit_id)

    def counted(self, unit_id: int, batches: int) -> None:
        self._counted[unit_id] = batches

    def redo(self, unit_id: int) -> bool:
        self._redo.add(unit_id)
        return True

    @property
    def unsent(self) -> int:
        """Acks not yet taken by the dispatcher."""
        return len(self._unsent) + self._in_flight

    def done_units(self) -> list[int]:
        return sorted(self._acked | set(self._unsent))

    def stats(self) -> DispatcherStats:
        """The whole job's figures as the dispatcher gave them with its last answer to an ack."""
        return self._job_stats

    def hung_s(self) -> float:
        return self._job_stats.hung_s

    @property
    def control_endpoint(self) -> str:
        return self.endpoint

    def open(self, ctx: zmq.asyncio.Context, data_endpoint: str, on_failure: Callable[[str], None],
             stop: threading.Event, waited_s: Callable[[], float]) -> list[Coroutine[Any, Any, None]]:
        """Attach (again, now with the data endpoint) and ack from the rank's event loop."""
        self.data_endpoint = data_endpoint
        self.on_failure = on_failure
        self.waited_s = waited_s
        return [self.run(ctx, stop)]

    def close(self) -> None:
        """Nothing: `run` closes its socket when it ends."""

    async def epoch_steps(self, epoch: int, rank: int, batches: int, stop: threading.Event) -> int | None:
        reply = await self.call(pb.ControlRequest(epoch_steps=pb.EpochSteps(epoch=epoch, rank=rank, batches=batches)),
                                stop)
        return reply.steps.steps if reply is not None and reply.WhichOneof("kind") == "steps" else None

    async def position(self, epoch: int, step: int, stop: threading.Event) -> RankPositions | None:
        reply = await self.call(pb.ControlRequest(position=pb.PositionQuery(epoch=epoch, step=step)), stop)
        if reply is None:
            return None
        ranks = reply.position.ranks
        return RankPositions([(r.units, r.batches) for r in ranks], [i for i, r in enumerate(ranks) if r.unsure],
                             [i for i, r in enumerate(ranks) if r.split])

    def close_waits(self, stream_done: bool) -> Iterator[CloseWait]:
        """Acks still on their way must reach the dispatcher."""
        yield CloseWait(self.linger_s, lambda: bool(self.unsent), poll_s=0.02)

    async def run(self, ctx: zmq.asyncio.Context, stop: threading.Event) -> None:
        """Attach with the data endpoint, then ack and say we are alive until the job is finished."""
        self._ctx = ctx
        self._lock = asyncio.Lock()
        next_beat = 0.0
        try:
            while not stop.is_set():
                now = asyncio.get_running_loop().time()
                if self._unsent or self._received or self._redo or self._counted or now >= next_beat:
                    batch, received, redo = dict(self._unsent), set(self._received), set(self._redo)
                    counted = dict(self._counted)
                    self._unsent.clear()
                    self._received.clear()
                    self._redo.clear()
                    self._counted.clear()
                    self._in_flight = len(batch)
                    reply = await self.call(pb.ControlRequest(ack=pb.Ack(unit_ids=list(batch),
                                                                         batches=list(batch.values()),
                                                                         received=sorted(received),
                                                                         redo=sorted(redo),
                                                                         counted_units=list(counted),
                                                                         counted_batches=list(counted.values()),
                                                                         waiting_s=self.waited_s(),
                                                                         need=need_to_proto(self.need()))), stop)
                    self._in_flight = 0
                    if reply is None:
                        self._unsent.update(batch)
                        self._received |= received
                        self._redo |= redo
                        self._counted.update(counted)
                        continue
                    self._acked |= set(batch)
                    if reply.HasField("stats"):
                        failed_before, stalled_before = self._job_stats.failure, bool(self._job_stats.stall)
                        self._job_stats = DispatcherStats(**{name: getattr(reply.stats, name)
                                                             for name in DispatcherStats.__dataclass_fields__})
                        if self._job_stats.failure and not failed_before:
                            self.on_failure(self._job_stats.failure)
                        self._say_stall(stalled_before, now)
                    next_beat = now + HEARTBEAT_S
                    if reply.WhichOneof("kind") == "finished":
                        self.finished = True
                await asyncio.sleep(0.02)
        finally:
            if self._sock is not None:
                self._sock.close(0)

    def _say_stall(self, stalled_before: bool, now: float) -> None:
        """Log the dispatcher's stall line here too (where this rank's user looks): when a stall begins,
        then once a minute while it lasts."""
        line = self._job_stats.stall
        if line and (not stalled_before or now - self._stall_said_at >= STALL_SAY_EVERY_S):
            log.error("rank %d: stalled: %s", self.rank, line)
            self._stall_said_at = now

    async def call(self, request: pb.ControlRequest, stop: threading.Event,
                   reply_timeout_s: float = 2.0) -> pb.ControlReply | None:
        """One request and its answer, re-attaching on a fresh socket until the dispatcher answers;
        None when stopped first."""
        assert self._lock is not None
        silent_from = asyncio.get_running_loop().time()
        async with self._lock:
            while not stop.is_set():
                if self._sock is None and not await self._connect(reply_timeout_s):
                    self._give_up_after(silent_from)
                    await asyncio.sleep(0.2)
                    continue
                try:
                    reply = await self._exchange(request, reply_timeout_s)
                except _Reattach:
                    reply = None
                else:
                    if reply is not None:
                        return reply
                    log.warning("the dispatcher at %s did not answer; retrying", self.endpoint)
                self._give_up_after(silent_from)
                assert self._sock is not None, "open since _connect: _exchange keeps it"
                self._sock.close(0)
                self._sock = None
        return None

    def _give_up_after(self, silent_from: float) -> None:
        """Once the dispatcher has been silent `give_up_s`, fail the job here, once, with what to do."""
        silent_s = asyncio.get_running_loop().time() - silent_from
        if self.give_up_s and silent_s >= self.give_up_s and not self._gave_up:
            self._gave_up = True
            self.on_failure(dispatcher_gone_line(self.endpoint, silent_s, self.give_up_s))

    async def _connect(self, timeout_s: float) -> bool:
        sock = dealer(self._ctx, self.consumer_id, CONTROL_MESSAGE_BYTES, self.curve, immediate=False)
        sock.connect(self.endpoint)
        self._sock = sock
        attached = await self._exchange(pb.ControlRequest(attach=pb.Attach(
            consumer_id=self.consumer_id, rank=self.rank, data_endpoint=self.data_endpoint,
            world_size=self.world_size, start=self.start)), timeout_s)
        if attached is None:
            sock.close(0)
            self._sock = None
            return False
        self.start = None
        return True

    async def _exchange(self, request: pb.ControlRequest, timeout_s: float) -> pb.ControlReply | None:
        assert self._sock is not None
        request.request_id = next(self._ids)
        request.job_credential = self.credential
        await self._sock.send(request.SerializeToString())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            if not await self._sock.poll(int(left * 1000)):
                break
            reply = pb.ControlReply()
            reply.ParseFromString(await self._sock.recv())
            if reply.request_id == request.request_id:
                if reply.WhichOneof("kind") == "error":
                    message = reply.error.message
                    if message == "attach first":
                        raise _Reattach
                    if message.startswith("only the job's consumer"):
                        raise NotAConsumer(f"the dispatcher at {self.endpoint} refused this consumer: {message}")
                    raise RankRefused(f"the dispatcher at {self.endpoint}: {message}")
                return reply
        return None
