"""The consumer's ZAP handler: admit CURVE clients whose public key is on the allow-list.

ZeroMQ asks the handler bound at inproc://zeromq.zap.01 (RFC 27) about every new connection
to a socket with a ZAP domain. It must be bound before the sockets it guards accept
connections. A refused peer never completes its handshake, so nothing it sends reaches the
receiver; every refusal is counted and (rate-limited) logged with the peer's address.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import zmq
import zmq.asyncio
from zmq.utils import z85

from accel.metrics import ConsumerMetrics
from protos.curve import ServerKeys

log = logging.getLogger("stoker.consumer")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class ZapHandler:
    def __init__(self, ctx: zmq.asyncio.Context, keys: ServerKeys, metrics: ConsumerMetrics) -> None:
        self.keys = keys
        self.metrics = metrics
        self.refused = 0
        self.socket = ctx.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)

    def answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"400", b"malformed ZAP request", b"", b""]
        version, request_id, _domain, address, _identity, mechanism, *credentials = frames
        key = z85.encode(credentials[0]) if mechanism == b"CURVE" and credentials and len(credentials[0]) == 32 \
            else b""
        if key and key in self.keys.allowed:
            self.metrics.auth.labels(result="admitted").inc()
            return [version, request_id, b"200", b"OK", key, b""]
        self.refused += 1
        self.metrics.auth.labels(result="refused").inc()
        if self.refused <= 3 or self.refused % 100 == 0:
            log.warning("refused a %s connection from %s: key %s is not allow-listed (%d refused so far)",
                        mechanism.decode(errors="replace"), address.decode(errors="replace"),
                        key.decode() or "(none)", self.refused)
        return [version, request_id, b"400", b"key not allow-listed", b"", b""]

    async def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                frames = await asyncio.wait_for(self.socket.recv_multipart(), timeout=0.25)
            except TimeoutError:
                continue
            await self.socket.send_multipart(self.answer(frames))

    def close(self) -> None:
        self.socket.close(0)
