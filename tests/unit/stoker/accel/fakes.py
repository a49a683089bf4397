"""Fakes for a consumer rank's unit tests: no sockets, no threads of ours, no worker processes.

- `FakeDispatcher`: a `DispatcherLink` that records what the rank tells it.
- `InlineLoop`: the rank's receive loop run on the calling thread: the real receiver and
  books, with a fake worker that hands its batches in whenever the stream waits for one.
- `rank(...)`: a Consumer over a small image manifest written to a temporary folder, with both.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from stoker.accel import assembly
from stoker.accel.consumer import Consumer
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.dispatcher import DispatcherStats
from stoker.accel.control.link import CloseWait, DispatcherLink
from stoker.accel.control.progress import RankPositions
from stoker.accel.receive_loop import END, ReceiveLoop
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.units import Unit
from stoker.protos import stoker_pb2 as pb

HOST, WORKER, PEER = "h0", "h0/p0.1", b"peer-1"
SAMPLES = 20  # units of 8, 8 and 4 images: batches of 4 give 2, 2 and 1 batches
CONFIG = ConsumerConfig(metrics_port=None, overlap=False, credit_window=8)


class FakeDispatcher:
    def __init__(self, total_units: int) -> None:
        self.total_units = total_units
        self.acks: list[tuple[int, int | None]] = []
        self.received_units: list[int] = []
        self.counts: dict[int, int] = {}  # text units' batch counts, told with their first batch
        self.redone: list[int] = []
        self.releases = 0
        self.on_failure: Callable[[str], None] | None = None
        self.data_endpoint = ""
        self.positions: list[tuple[int, int]] = []  # the (epoch, step) every position() was asked for
        self.still_busy = 0  # close_waits: how many more times its wait says "still waiting"
        self.asked_busy = 0
        self.closed_done: list[bool] = []  # close_waits' stream_done, each time a rank closed

    @property
    def control_endpoint(self) -> str:
        return "tcp://127.0.0.1:1" if self.data_endpoint else ""

    @property
    def finished(self) -> bool:
        return len({unit for unit, _ in self.acks}) == self.total_units

    def open(self, ctx: object, data_endpoint: str, on_failure: Callable[[str], None],
             stop: threading.Event, waited_s: Callable[[], float]) -> list:
        self.data_endpoint, self.on_failure = data_endpoint, on_failure
        return []

    def close(self) -> None:
        pass

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        self.acks.append((unit_id, batches))
        return True

    def received(self, unit_id: int) -> None:
        self.received_units.append(unit_id)

    def counted(self, unit_id: int, batches: int) -> None:
        self.counts[unit_id] = batches

    def redo(self, unit_id: int) -> bool:
        self.redone.append(unit_id)
        return True

    def stats(self) -> DispatcherStats:
        done = len({unit for unit, _ in self.acks})
        return DispatcherStats(pending=self.total_units - done, leased=0, done=done, hosts_alive=1,
                               releases=self.releases)

    def hung_s(self) -> float:
        return 0.0

    async def epoch_steps(self, epoch: int, rank: int, batches: int, stop: threading.Event) -> int | None:
        return batches

    async def position(self, epoch: int, step: int, stop: threading.Event) -> RankPositions | None:
        self.positions.append((epoch, step))
        return RankPositions([(step // 2, step % 2)])

    def close_waits(self, stream_done: bool) -> Iterator[CloseWait]:
        self.closed_done.append(stream_done)

        def waiting() -> bool:
            self.asked_busy += 1
            return self.asked_busy <= self.still_busy

        yield CloseWait(5.0, waiting, poll_s=0.0)


_link: DispatcherLink = FakeDispatcher(0)  # the fake keeps to the protocol (a type checker says so here)


class RecordingSocket:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        self.sent.append(frames)


class InlineLoop(ReceiveLoop):
    """The receive loop on the caller's thread; `messages` is what the fake worker sends, handed to
    the real receiver one at a time while the stream has nothing queued."""

    messages: list[list[bytes]]

    def start(self) -> None:
        if self.receiver is not None:
            return
        self.messages = []
        self.receiver = self.receiver_on(RecordingSocket())  # type: ignore[arg-type]
        self.data_endpoint = "tcp://127.0.0.1:2"
        self.dispatcher.open(None, self.data_endpoint, self.on_job_failed, self.stopping,
                             self.waited_s)  # type: ignore[arg-type]

    @property
    def started(self) -> bool:
        return self.receiver is not None

    @property
    def alive(self) -> bool:
        return self.started and not self.stopping.is_set()

    def next(self) -> object:
        assert self.receiver is not None
        while self.queue.empty():
            if not self.messages:
                raise AssertionError("the stream waits for a batch the fake worker never sends")
            self.receiver.handle([PEER, *self.messages.pop(0)])
        item = self.queue.get_nowait()
        if item is END and self._error is not None:
            raise self._error
        return item

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        callback(*args)

    def call(self, read: Callable[[], object]) -> object:  # type: ignore[override]
        return read()

    def wait_for(self, coroutine, what: str = "", timeout_s: float = 0.0):  # type: ignore[no-untyped-def]
        return asyncio.new_event_loop().run_until_complete(coroutine)

    def join(self, timeout_s: float = 5.0) -> None:
        pass


def manifest(folder: Path, samples: int = SAMPLES) -> str:
    path = folder / "manifest.json"
    Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", samples, 1, "", 0)]).save(path)
    return str(path)


def job(folder: Path, **fields: object) -> JobConfig:
    return JobConfig(manifest(folder), image_size=4, batch_size=4, unit_batches=2, **fields)  # type: ignore[arg-type]


def rank(monkeypatch: pytest.MonkeyPatch, folder: Path, cfg: ConsumerConfig = CONFIG, **fields: object) -> Consumer:
    """A started rank 0 with a FakeDispatcher (`.dispatcher`) and an InlineLoop (`.loop`)."""
    monkeypatch.setattr(assembly, "ReceiveLoop", InlineLoop)
    monkeypatch.setattr(assembly, "dispatcher_for",
                        lambda cfg, joined, plan, start, me, services: FakeDispatcher(plan.total_units))
    consumer = Consumer(cfg, job(folder, **fields))
    consumer.start()
    return consumer


def unit_batches(consumer: Consumer, unit: Unit, worker_id: str = WORKER) -> list[list[bytes]]:
    """What a worker sends for `unit`: its batches of `batch_size` images, signed with its lease."""
    ids = unit.sample_ids().tolist()
    size = consumer.job.batch_size
    token = consumer.leases.token(unit.unit_id, HOST, worker_id)
    out = []
    for index, start in enumerate(range(0, len(ids), size)):
        part = ids[start:start + size]
        images = np.full((len(part), 4, 4, 3), 7, np.uint8)
        labels = np.zeros(len(part), np.int32)
        header = pb.BatchHeader(job_id=consumer.job.job_id, epoch=unit.epoch, unit_id=unit.unit_id,
                                batch_index=index, last_in_unit=start + size >= len(ids), sample_ids=part,
                                rows=len(part), worker_id=worker_id, lease_token=token)
        header.frames.add(tensor="image", dtype="|u1", shape=list(images.shape), nbytes=images.nbytes)
        header.frames.add(tensor="label", dtype="<i4", shape=[len(part)], nbytes=labels.nbytes)
        out.append([pb.DataMessage(batch=header).SerializeToString(), images.tobytes(), labels.tobytes()])
    return out


def hello(consumer: Consumer, unit: Unit, worker_id: str = WORKER) -> list[bytes]:
    token = consumer.leases.token(unit.unit_id, HOST, worker_id)
    return [pb.DataMessage(hello=pb.Hello(worker_id=worker_id, job_id=consumer.job.job_id, host_id=HOST,
                                          unit_id=unit.unit_id, lease_token=token)).SerializeToString()]


def send_job(consumer: Consumer, repeat: set[int] = frozenset()) -> list[Unit]:
    """Queue the fake worker's whole job for the rank, in plan order (the units in `repeat` twice);
    returns the units."""
    units = [u for e in range(consumer.job.epochs) for u in consumer.plan.rank_units(e, consumer.rank)]
    loop = consumer.loop
    assert isinstance(loop, InlineLoop)
    loop.messages.append(hello(consumer, units[0]))
    for unit in units:
        loop.messages += unit_batches(consumer, unit)
        if unit.unit_id in repeat:
            loop.messages += unit_batches(consumer, unit)
    return units
