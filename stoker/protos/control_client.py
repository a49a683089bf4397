"""Request/reply with the dispatcher that survives a slow or absent dispatcher.

A DEALER socket with a reply timeout; on timeout the socket is closed and reopened (so no
stale requests pile up) and the same request id is resent, with exponential back-off. While
nothing listens, the back-off is spent waiting for the connection, so a dispatcher that comes
up is asked within ZeroMQ's reconnect interval.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Callable
from typing import overload

import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys
from stoker.protos.endpoints import why_unreachable
from stoker.protos.errors import PeerError
from stoker.protos.sockets import CONTROL_MESSAGE_BYTES, dealer

log = logging.getLogger("stoker.worker")
WARN_AFTER_S = 5.0  # a request unanswered this long is logged once, with what a TCP connection there meets


MISDIRECTED = "misdirected"  # an Error's reason when the other service answered: asking again cannot help

class DispatcherUnreachable(PeerError):
    """No answer from the dispatcher within the time the caller gave (or the caller is stopping)."""


class ControlClient:
    """Request and reply with the dispatcher over a DEALER, retried until answered: a reply that
    does not come reopens the socket, so nothing stale stays queued."""

    def __init__(self, ctx: zmq.Context, endpoint: str, identity: str, reply_timeout_s: float = 2.0,
                 curve: ClientKeys | None = None, fleet: bool = False) -> None:
        """`fleet`: the peer is a `stoker fleet` (the words of a request it leaves unanswered say so)."""
        self.ctx = ctx
        self.curve = curve
        self.endpoint = endpoint
        self.identity = identity
        self.reply_timeout_s = reply_timeout_s
        self._ids = itertools.count(secrets.randbits(40) + 1)  # its own: a reused identity gets no other's cache
        self._socket: zmq.Socket | None = None
        self.fleet = fleet
        self.peer = "the fleet" if fleet else "the dispatcher"

    def _open(self) -> zmq.Socket:
        if self._socket is None:
            sock = dealer(self.ctx, self.identity, CONTROL_MESSAGE_BYTES, self.curve)
            sock.connect(self.endpoint)
            self._socket = sock
        return self._socket

    def _reset(self) -> None:
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None

    @overload
    def request(self, request: pb.ControlRequest, give_up_after_s: float | None = 30.0,
                should_stop: Callable[[], bool] = ...) -> pb.ControlReply: ...

    @overload
    def request(self, request: pb.FleetRequest, give_up_after_s: float | None = 30.0,
                should_stop: Callable[[], bool] = ...) -> pb.FleetReply: ...

    def request(self, request: pb.ControlRequest | pb.FleetRequest, give_up_after_s: float | None = 30.0,
                should_stop: Callable[[], bool] = lambda: False) -> pb.ControlReply | pb.FleetReply:
        """Send and wait for the matching reply, in the envelope of the request's service (a dispatcher's
        ControlReply, a fleet's FleetReply); raise DispatcherUnreachable past the deadline."""
        envelope = pb.FleetReply if isinstance(request, pb.FleetRequest) else pb.ControlReply
        request.request_id = next(self._ids)
        payload = request.SerializeToString()
        deadline = None if give_up_after_s is None else time.monotonic() + give_up_after_s
        warn_at: float | None = time.monotonic() + WARN_AFTER_S
        backoff = 0.05
        while True:
            if should_stop():
                raise DispatcherUnreachable("stopping")
            sock = self._open()
            connected = True
            try:
                sock.send(payload, flags=zmq.NOBLOCK)
            except zmq.Again:  # not connected yet (IMMEDIATE keeps nothing queued): keep the socket and
                # wait for the connection itself, so a dispatcher that comes up is asked at once, not
                # after the rest of a back-off
                connected = False
                sock.poll(int(backoff * 1000), zmq.POLLOUT)
            else:
                if sock.poll(int(self.reply_timeout_s * 1000), zmq.POLLIN):
                    reply = envelope()
                    reply.ParseFromString(sock.recv())
                    if reply.request_id == request.request_id:
                        return reply
                    continue  # a late reply to an earlier try: ask again, the answer is cached
                self._reset()  # sent but unanswered: start afresh so nothing stale is queued
            if deadline is not None and time.monotonic() > deadline:
                raise DispatcherUnreachable(f"no answer from {self.peer} at {self.endpoint} for {give_up_after_s:.0f} "
                                            f"s: {why_unreachable(self.endpoint, fleet=self.fleet)}")
            if warn_at is not None and time.monotonic() > warn_at:
                log.warning("%s: no answer from %s at %s for %.0f s (%s); still trying", self.identity, self.peer,
                            self.endpoint, WARN_AFTER_S, why_unreachable(self.endpoint, fleet=self.fleet))
                warn_at = None
            if connected:
                time.sleep(backoff)  # it answered nothing: give a busy dispatcher room
            backoff = min(backoff * 2, 2.0)

    def close(self) -> None:
        """Close the socket (the next request opens a new one)."""
        self._reset()
