"""One way to make Stoker's ZeroMQ sockets, so each carries the same guards: a size cap on what a
peer may send (MAXMSGSIZE: a stranger cannot make us allocate), no linger on close unless asked,
CURVE when keys are given, and ROUTERs that raise on an unroutable reply instead of dropping it."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import zmq

from stoker.protos.curve import ClientKeys, ServerKeys

CONTROL_MESSAGE_BYTES = 1 << 20  # the largest control message: a job spec at most
S = TypeVar("S", bound=zmq.Socket)  # a plain or an asyncio socket: the kind the context makes


def dealer(ctx: zmq.Context[S], identity: str, max_message_bytes: int, curve: ClientKeys | None = None,
           immediate: bool = True, linger_ms: int = 0) -> S:
    """A DEALER named `identity`, not yet connected. `immediate`: queue nothing for a peer whose
    connection is not complete (so a dead endpoint does not swallow requests)."""
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, linger_ms)
        if immediate:
            sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        sock.setsockopt_string(zmq.IDENTITY, identity)
        if curve is not None:
            curve.apply(sock)
    except (zmq.ZMQError, ValueError):
        sock.close(0)  # an unclosed socket would hang the context's term()
        raise
    return sock


def router(ctx: zmq.Context[S], max_message_bytes: int, keys: ServerKeys | None = None,
           receive_hwm: int | None = None) -> S:
    """A ROUTER, not yet bound: unroutable replies raise (ROUTER_MANDATORY), CURVE server when keyed."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if receive_hwm is not None:
        sock.setsockopt(zmq.RCVHWM, receive_hwm)
    if keys is not None:
        keys.apply(sock)
    return sock


def send_nowait(sock: zmq.Socket, parts: list[bytes]) -> BaseException | None:
    """Send without blocking; the error (ROUTER_MANDATORY: the peer is gone, or its queue is full),
    whether the socket is a plain one that raises or an asyncio one that sets its future's
    exception. None when it went (or is on its way)."""
    try:
        sent = sock.send_multipart(parts, flags=zmq.NOBLOCK)
    except zmq.ZMQError as exc:
        return exc
    if isinstance(sent, asyncio.Future) and sent.done():
        return sent.exception()
    return None


def end_context(ctx: zmq.Context) -> None:
    """Close whatever of the context is still open, at once, and terminate it. A plain term() waits
    for every socket to be closed: one left open on an error path (a monitor whose coroutine never
    ran) would hold it for ever, and the caller would hang instead of raising its error."""
    ctx.destroy(linger=0)
