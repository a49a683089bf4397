"""Who may connect to the service's sockets, in which role, and how each refusal is counted.

pyzmq's asyncio authenticator answers ZeroMQ's ZAP requests (RFC 27) for every CURVE
connection to a socket with Stoker's ZAP domain: a key on an allow-list is admitted, and its
connection's User-Id becomes "ROLE:NAME" (protos.curve), which every message it sends then
carries; the control server and the receiver read the role from there. A refused peer never
completes its handshake, so nothing it sends reaches the service.

A client with no key at all (or the wrong server key) fails the CURVE handshake before ZAP
is asked, so refusals are counted from each guarded socket's monitor instead:
`stoker_consumer_auth_total{result="admitted"|"refused"|"failed_handshake"}`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import Counter
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from stoker.protos.curve import ZAP_DOMAIN, ServerKeys
from stoker.protos.droplog import DropLog

log = logging.getLogger("stoker.consumer")
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_RESULTS: dict[int, str] = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "admitted", zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused",
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed_handshake",
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed_handshake"}


class KeyAuthenticator(AsyncioAuthenticator):
    """Admit allow-listed CURVE keys and name each connection after its key's role and name."""

    def __init__(self, ctx: zmq.asyncio.Context, keys: ServerKeys) -> None:
        super().__init__(ctx, log=logging.getLogger("stoker.zap"))
        self.keys = keys
        self._refusals = DropLog(log, "a CURVE connection", every=100)

    def start(self) -> None:
        """Bind the ZAP endpoint; must run on the event loop, before any guarded socket binds."""
        super().start()
        self.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: `key` is the client's z85 public key."""
        if key in self.keys.allowed:
            return True
        self._refusals("its key is not allow-listed", key.decode(errors="replace"))
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.keys.allowed[z85.encode(client_public_key)]


def monitor_handshakes(sock: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
    """A monitor socket for `sock`'s handshake outcomes; call before `sock` binds."""
    return sock.get_monitor_socket(HANDSHAKE_EVENTS)


async def count_handshakes(monitor: zmq.asyncio.Socket, outcomes: Counter, stop: threading.Event,
                           on_event: Callable[[Mapping[str, Any]], None] = lambda event: None) -> None:
    """Count every admitted and refused connection in `outcomes{result=...}` until `stop`; hand
    every other event to `on_event`."""
    failures = DropLog(log, "a CURVE connection", every=100)
    try:
        while not stop.is_set():
            if not await monitor.poll(250):
                continue
            event = parse_monitor_message(await monitor.recv_multipart())
            result = _RESULTS.get(event["event"])
            if result is None:
                on_event(event)
                continue
            outcomes.labels(result=result).inc()
            if result == "failed_handshake":
                failures("it failed the CURVE handshake (a peer with no key, or with another service's server "
                         "key)", f"a peer of {event['endpoint'].decode(errors='replace')}")
    finally:
        monitor.close(0)
