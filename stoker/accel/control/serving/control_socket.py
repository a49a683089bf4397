"""The control sockets' shell, shared by `stoker dispatch` (accel.control.service), rank 0's dispatcher
(accel.control.local) and `stoker fleet` (accel.fleet.service): the ROUTER and its monitor,
ZAP started before the bind, and a service's event loop with its signals and everything closed at
its end.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import uvloop
import zmq
import zmq.asyncio

from stoker.protos.curve import ServerKeys
from stoker.protos.endpoints import bind
from stoker.protos.sockets import CONTROL_MESSAGE_BYTES, end_context, router
from stoker.protos.zap import HANDSHAKE_EVENTS, KeyAuthenticator


def control_router(ctx: zmq.asyncio.Context, keys: ServerKeys | None) -> tuple[zmq.asyncio.Socket,
                                                                                 zmq.asyncio.Socket]:
    """The dispatcher's ROUTER (unroutable replies raise, small messages only, CURVE when keyed),
    and its monitor (closed connections, and handshakes when keyed), made before it binds."""
    sock = router(ctx, CONTROL_MESSAGE_BYTES, keys)
    # A client that times out opens a new socket under the same identity while its old one is torn
    # down: without handover the ROUTER keeps the old pipe and leaves the new one unrouted, and each
    # retry (another new socket) can meet the same race, so a client under load may never be answered.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock, sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | (HANDSHAKE_EVENTS if keys else 0))


def bind_control(ctx: zmq.asyncio.Context, keys: ServerKeys | None,
                 endpoint: str) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket, str]:
    """The control ROUTER and its monitor, bound to `endpoint`; returns both and the endpoint bound.
    A bind that fails (a port in use) closes both before it raises: an open monitor socket would
    hold the context's term() for ever, so the caller would hang instead of reporting the port."""
    sock, monitor = control_router(ctx, keys)
    try:
        bound = bind(sock, endpoint, "control")
    except BaseException:
        monitor.close(0)
        sock.close(0)
        raise
    return sock, monitor, bound


def guarded_control(ctx: zmq.asyncio.Context, keys: ServerKeys | None,
                    endpoint: str) -> tuple[KeyAuthenticator | None, zmq.asyncio.Socket, zmq.asyncio.Socket, str]:
    """ZAP (with keys) started before the control ROUTER binds, then the bind (bind_control): a bind that
    fails stops ZAP and ends the context before it raises, so nothing is left to wait on."""
    authenticator = KeyAuthenticator(ctx, keys) if keys else None
    if authenticator is not None:
        authenticator.start()  # before the bind
    try:
        sock, monitor, bound = bind_control(ctx, keys, endpoint)
    except BaseException:
        if authenticator is not None:
            authenticator.stop()
        end_context(ctx)
        raise
    return authenticator, sock, monitor, bound


def run_service(serve: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service's coroutine on an event loop of its own, until it ends."""
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


@asynccontextmanager
async def serving(keys: ServerKeys | None, endpoint: str,
                  stop: threading.Event) -> AsyncIterator[tuple[zmq.asyncio.Socket, zmq.asyncio.Socket, str]]:
    """A service's control socket, its monitor and the endpoint bound (guarded_control), with SIGTERM and
    SIGINT setting `stop` (on the main thread); at the end the sockets are closed, ZAP stopped and the
    context ended."""
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    ctx = zmq.asyncio.Context()
    authenticator, sock, monitor, bound = guarded_control(ctx, keys, endpoint)
    try:
        yield sock, monitor, bound
    finally:
        sock.close(0)
        monitor.close(0)
        if authenticator is not None:
            authenticator.stop()
        end_context(ctx)
