"""A rank's event-loop thread (uvloop + zmq.asyncio): it owns the sockets and the books.

On it run the rank's data ROUTER (accel.receiver: lease checks, credits, frame checks,
duplicate drops, plan order), its dispatcher link (accel.control.link: rank 0's control
socket, or the link to a dispatcher elsewhere), the sweep of silent senders and the systemd
watchdog. What the receiver releases, in plan order, goes to `queue`; the training thread
takes it with `next()`, and hands finished steps back with `call_soon`. `END` ends the
stream: when the rank's last unit is acked, when the loop dies, or on `end(error)` (the
error is raised to whoever pulls next).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import uvloop
import zmq
import zmq.asyncio

from stoker.accel.control.link import DispatcherLink
from stoker.accel.ledger import Ledger
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.receiver import Receiver
from stoker.accel.schema import BatchSchema
from stoker.accel.stream import EpochEnd, StreamOrder
from stoker.protos.aio import pump, run_until_one_fails
from stoker.protos.curve import ServerKeys
from stoker.protos.endpoints import advertised, bind
from stoker.protos.errors import PeerError
from stoker.protos.framing import MAX_FRAME_BYTES
from stoker.protos.leases import LeaseSigner
from stoker.protos.sd_notify import Notifier
from stoker.protos.sockets import end_context, router
from stoker.protos.zap import KeyAuthenticator, count_handshakes, monitor_handshakes

END = object()  # the end of the rank's stream
ANSWER_TIMEOUT_S = 30.0  # the longest a rank waits for the dispatcher's answer to a question


class DispatcherSilent(PeerError, RuntimeError):
    """The dispatcher did not answer a question in time; the message says which."""
T = TypeVar("T")


@dataclass(frozen=True)
class DataSocket:
    """Where the data socket listens, with what keys, and how it gives credit."""

    bind: str
    advertise_host: str | None
    keys: ServerKeys | None
    credit_window: int
    budget: int  # batches all senders together may have in hand
    sender_timeout_s: float
    # the rank's steps may wait until its whole epoch stream is here (BERT ranks in lockstep, whose epoch's steps
    # are settled from every rank's count): each stream's count goes to the dispatcher as soon as it is all here
    # (ReceiveLoop._epoch_end), and batches released to the step count against the budget only (accel.credit)
    steps_wait_on_stream: bool = False


class ReceiveLoop:
    def __init__(self, job_id: str, socket: DataSocket, schema: BatchSchema, ledger: Ledger, order: StreamOrder,
                 leases: LeaseSigner, metrics: ConsumerMetrics, dispatcher: DispatcherLink,
                 on_job_failed: Callable[[str], None], systemd: Notifier | None = None) -> None:
        """`on_job_failed(reason)`: the dispatcher failed the job (called on the loop)."""
        self.job_id = job_id
        self.socket = socket
        self.schema = schema
        self.ledger = ledger
        self.order = order
        self.leases = leases
        self.metrics = metrics
        self.dispatcher = dispatcher
        self.on_job_failed = on_job_failed
        self.systemd = systemd or Notifier()
        self.queue: queue.Queue[object] = queue.Queue()
        self.data_endpoint = ""
        self.receiver: Receiver | None = None
        self.stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._waiting_since: float | None = None  # a thread waits in next() on an empty queue since then
        self._reports: set[asyncio.Task] = set()  # epoch counts on their way to the dispatcher

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Bind (a port in use raises here) and serve on a thread of its own. Idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="stoker-receive", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to the training thread
            self._error = exc
            self._ready.set()
            self.queue.put(END)
        finally:
            loop.close()

    async def _serve(self) -> None:
        ctx = zmq.asyncio.Context()
        keys = self.socket.keys
        authenticator = KeyAuthenticator(ctx, keys) if keys else None
        if authenticator is not None:
            authenticator.start()  # before any bind
        data = router(ctx, MAX_FRAME_BYTES + (1 << 20), keys, receive_hwm=10_000)
        tasks: list[Coroutine[Any, Any, None]] = []
        try:
            try:
                if keys:
                    tasks.append(count_handshakes(monitor_handshakes(data), self.metrics.auth, self.stopping))
                self.data_endpoint = advertised(bind(data, self.socket.bind, "data"), self.socket.advertise_host)
                receiver = self.receiver = self.receiver_on(data)
                tasks += [pump(data, receiver.handle, self.stopping), self._sweep_senders(receiver)]
                tasks += self.dispatcher.open(ctx, self.data_endpoint, self.on_job_failed, self.stopping,
                                              self.waited_s)
                tasks.append(self._feed_watchdog())
            except BaseException:  # a port in use: the coroutines made so far never run; close them, unwarned
                for coroutine in tasks:
                    coroutine.close()
                raise
            self._ready.set()
            await run_until_one_fails(tasks, self.stopping)
        finally:
            data.close(0)
            self.dispatcher.close()
            if authenticator is not None:
                authenticator.stop()
            end_context(ctx)

    def receiver_on(self, data: zmq.Socket) -> Receiver:
        """The rank's books of what arrives on `data`: released batches go to `queue`, units to the
        dispatcher."""
        return Receiver(data, self.job_id, self.socket.credit_window, self.ledger, self.queue, self.metrics,
                        self._unit_done, self.schema, self.leases, self.order, keyed=self.socket.keys is not None,
                        sender_timeout_s=self.socket.sender_timeout_s, on_unit_received=self.dispatcher.received,
                        on_unit_counted=self.dispatcher.counted,
                        on_unit_short=self.dispatcher.redo, budget=self.socket.budget, on_epoch_end=self._epoch_end,
                        steps_wait_on_stream=self.socket.steps_wait_on_stream)

    async def _sweep_senders(self, receiver: Receiver) -> None:
        while not self.stopping.is_set():
            await asyncio.sleep(receiver.sweep_every_s)
            receiver.sweep()

    async def _feed_watchdog(self) -> None:
        while not self.stopping.is_set():
            self.systemd.watchdog()
            await asyncio.sleep(1.0)

    def _epoch_end(self, end: EpochEnd) -> None:
        """The rank's stream of an epoch is all here: its count goes to the dispatcher now, not when the training
        loop reaches the epoch's end (Consumer.steps_of asks again then). A rank stepping in lockstep with one
        that waits for this count would otherwise never get there: its prefetch and its credit are full."""
        if self.socket.steps_wait_on_stream:
            report = asyncio.get_running_loop().create_task(
                self.dispatcher.epoch_steps(end.epoch, self.order.rank, end.batches, self.stopping))
            self._reports.add(report)
            report.add_done_callback(self._reports.discard)

    def _unit_done(self, unit_id: int, batches: int) -> None:
        self.dispatcher.ack(unit_id, batches)
        if self.order.done and self.ledger.open_units == 0:
            self.queue.put(END)

    # ---- from the training thread ------------------------------------------------------
    def end(self, error: BaseException) -> None:
        """End the stream: whoever pulls it gets `error` after what is queued before."""
        self._error = error
        self.queue.put(END)

    def next(self) -> object:
        """The next released batch or epoch end, or END (raising the error the stream ended with)."""
        while True:
            try:
                item = self.queue.get_nowait() if self._waiting_since is None else self.queue.get(timeout=0.5)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive():
                    self._waiting_since = None
                    return END
                if self._waiting_since is None:
                    self._waiting_since = time.monotonic()
                continue
            self._waiting_since = None
            if item is END and self._error is not None:
                raise self._error
            return item

    def waited_s(self) -> float:
        """How long the rank has waited for its next batch (0: it is not waiting): what its heartbeats
        tell the dispatcher's stall watchdog."""
        since = self._waiting_since
        return 0.0 if since is None else time.monotonic() - since

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback(*args)` on the loop, without waiting."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback, *args)

    def call(self, read: Callable[[], T]) -> T:
        """Run `read` on the loop (which owns the books) and return its result."""
        assert self._loop is not None
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                result.set_result(read())
            except BaseException as exc:  # handed to the caller
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return result.result(timeout=10)

    def wait_for(self, coroutine: Coroutine[Any, Any, T], what: str, timeout_s: float = ANSWER_TIMEOUT_S) -> T:
        """Run `coroutine` (a question to the dispatcher: `what`, for the error) on the loop and return its
        result; waits in short slices, so a Ctrl-C is seen, and at most `timeout_s`, then says what it
        waited for (DispatcherSilent)."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    return future.result(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
                except concurrent.futures.TimeoutError:
                    if time.monotonic() >= deadline:
                        raise DispatcherSilent(f"no answer from the dispatcher in {timeout_s:.0f} s to {what} (it is "
                                               f"down, frozen or unreachable)") from None
        finally:
            future.cancel()

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
