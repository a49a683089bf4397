"""Rank 0's dispatcher in its own process: the job's `Dispatcher` and its control socket, served
on the rank's event loop.

The rank acks, reports its epochs and asks for positions by direct calls (it is on the same
loop as the control server, so nothing is sent); workers and the other ranks reach the
dispatcher through the control socket bound here. The rank keeps telling the dispatcher it is
alive, as an attached rank elsewhere does with its heartbeats, so that its rank is never
taken as silent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import zmq.asyncio

from stoker.accel.control.dispatcher import Dispatcher, DispatcherStats
from stoker.accel.control.fleet_member import NOT_MEASURED, Need
from stoker.accel.control.link import CloseWait
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.progress import RankPositions
from stoker.accel.control.serving.server import AccessPolicy, ControlServer, bind_control, serve_control
from stoker.accel.control.watchdog import StallBounds
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ServerKeys
from stoker.protos.endpoints import advertised
from stoker.protos.leases import LeaseSigner


@dataclass(frozen=True)
class ControlSocket:
    """Where the control socket listens and who may use it."""

    bind: str
    advertise_host: str | None
    keys: ServerKeys | None
    access: AccessPolicy


@dataclass(frozen=True)
class Closing:
    """How long a closing rank 0 waits: for the other ranks' acks, and for live hosts to hear
    that the job is over."""

    rank_wait_s: float
    linger_s: float


class InProcessDispatcher:
    def __init__(self, dispatcher: Dispatcher, socket: ControlSocket, job_spec: Callable[[str], pb.JobSpec],
                 metrics: ControlMetrics, leases: LeaseSigner, consumer_id: str, closing: Closing,
                 stall: StallBounds | None = None) -> None:
        """`job_spec(data_endpoint)`: the job as the control socket hands it out."""
        self.stall = stall
        self.dispatcher = dispatcher
        self.socket = socket
        self.job_spec = job_spec
        self.metrics = metrics
        self.leases = leases
        self.consumer_id = consumer_id
        self.closing = closing
        self.total_units = dispatcher.total_units
        self.server: ControlServer | None = None
        self._endpoint = ""
        self._sockets: list[zmq.asyncio.Socket] = []
        self.need: Callable[[], Need] = lambda: NOT_MEASURED  # what rank 0 measures (its consumer sets it)

    @property
    def control_endpoint(self) -> str:
        return self._endpoint

    @property
    def finished(self) -> bool:
        return self.dispatcher.finished

    def open(self, ctx: zmq.asyncio.Context, data_endpoint: str, on_failure: Callable[[str], None],
             stop: threading.Event, waited_s: Callable[[], float]) -> list[Coroutine[Any, Any, None]]:
        control, monitor, bound = bind_control(ctx, self.socket.keys, self.socket.bind)
        self._sockets = [control]  # the monitor closes with its coroutine (serve_control)
        self._endpoint = advertised(bound, self.socket.advertise_host)
        self.dispatcher.attach_rank(0, data_endpoint, self.consumer_id)
        server = self.server = ControlServer(control, self.dispatcher, self.job_spec(data_endpoint), self.metrics,
                                             self.leases, self.socket.access, self.stall)
        server.on_failure = on_failure
        server.update_gauges()
        return [*serve_control(control, monitor, server, stop), self._heard(stop, server, waited_s)]

    async def _heard(self, stop: threading.Event, server: ControlServer, waited_s: Callable[[], float]) -> None:
        """Rank 0 is alive while its loop runs (well within the host timeout), and says how long it has
        waited for a batch and what it measures, as a rank elsewhere does with its acks."""
        while not stop.is_set():
            self.dispatcher.liveness.rank_heard(0, self.consumer_id)
            server.watchdog.rank_waiting(0, waited_s())
            server.heard_need(0, self.need())
            await asyncio.sleep(min(1.0, self.dispatcher.host_timeout_s / 4))

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(0)

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        return self.dispatcher.ack(unit_id, batches)

    def received(self, unit_id: int) -> None:
        self.dispatcher.received(unit_id)

    def counted(self, unit_id: int, batches: int) -> None:
        self.dispatcher.progress.remember_batches({unit_id: batches})

    def redo(self, unit_id: int) -> bool:
        """As another rank's redo: through the control server, which holds it while a transform runs."""
        return self.server.redo_short(0, unit_id) if self.server is not None else self.dispatcher.redo(unit_id)

    def stats(self) -> DispatcherStats:
        return self.dispatcher.stats()

    def hung_s(self) -> float:
        return self.dispatcher.poison.hung_s  # one float read: safe from the bottleneck monitor's thread

    async def epoch_steps(self, epoch: int, rank: int, batches: int, stop: threading.Event) -> int | None:
        return self.dispatcher.progress.epoch_steps(epoch, rank, batches)

    async def position(self, epoch: int, step: int, stop: threading.Event) -> RankPositions | None:
        return self.dispatcher.progress.where(epoch, step)

    def close_waits(self, stream_done: bool) -> Iterator[CloseWait]:
        """The other ranks' last acks (when this rank is done: they may still be on their way), then
        live hosts hearing that the job is over."""
        server = self.server
        if server is None:
            return
        if stream_done:
            several = self.dispatcher.plan.world_size > 1
            yield CloseWait(self.closing.rank_wait_s if several else self.closing.linger_s,
                            lambda: not self.dispatcher.finished)
        if self.dispatcher.over:
            yield CloseWait(self.closing.linger_s, lambda: bool(server.hosts_not_told()))
