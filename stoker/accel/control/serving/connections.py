"""The control socket's connections: which one each peer speaks on, what it leases as or attached as,
and which closed and stayed closed.

A worker process that dies closes its connection; the socket's monitor names the connection (its
file descriptor), and the units the peer leased go back to the queue CLOSE_GRACE_S later, unless it
has spoken again by then on a new connection (a client that timed out reconnects at once). Pure
state on an injected clock: the control server (accel.control.serving.server) feeds it what the socket
says and re-leases what `stayed_closed` returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stoker.accel.control.serving.last_heard import LastHeard

CLOSE_GRACE_S = 1.0  # a closed connection whose peer has not come back this long: its leases are re-leased


class Connections:
    def __init__(self, now: Callable[[], float] = time.monotonic, grace_s: float = CLOSE_GRACE_S) -> None:
        self.now = now
        self.grace_s = grace_s
        self._fd_of: dict[bytes, int] = {}  # peer -> the connection (file descriptor) it last spoke on
        self._peer_on: dict[int, bytes] = {}  # ... and back
        self._closed = LastHeard[bytes]()  # peer -> when its connection closed
        self._closed_fd: dict[bytes, int] = {}  # ... and which connection that was
        self._leaser: dict[bytes, tuple[str, str]] = {}  # peer -> (host, worker) it leases as
        self._consumers: dict[bytes, tuple[int, str]] = {}  # peer -> (rank, consumer id) of attached ranks

    def spoke(self, peer: bytes, fd: int | None) -> None:
        """The peer spoke on connection `fd` (ZMQ_SRCFD of its message; None: not known), so that its closing
        names it. A message read after its connection closed (it was queued) changes nothing; one on a new
        connection means the peer is back."""
        closed = self._closed_fd.get(peer)
        if closed is not None and (fd is None or fd == closed):
            return
        self._forget_closed(peer)
        if fd is None or self._fd_of.get(peer) == fd:
            return
        self._peer_on.pop(self._fd_of.get(peer, -1), None)
        self._fd_of[peer] = fd
        self._peer_on[fd] = peer

    def closed(self, fd: int) -> None:
        """The socket's monitor says connection `fd` closed (its peer is dead, or reconnecting)."""
        peer = self._peer_on.pop(fd, None)
        if peer is not None and self._fd_of.get(peer) == fd:
            del self._fd_of[peer]
            self._closed.record(peer, self.now())
            self._closed_fd[peer] = fd

    def leases_as(self, peer: bytes, host_id: str, worker_id: str) -> None:
        self._leaser[peer] = (host_id, worker_id)

    def stayed_closed(self) -> list[tuple[str, str]]:
        """(host, worker) of each leasing peer whose connection closed at least the grace ago and did not come
        back; each is named once, and forgotten."""
        gone = []
        for peer in self._closed.silent_for(self.grace_s, self.now(), at_least=True):
            self._forget_closed(peer)
            leaser = self._leaser.pop(peer, None)
            if leaser is not None:
                gone.append(leaser)
        return gone

    def attach(self, peer: bytes, rank: int, consumer_id: str) -> None:
        """The peer attached as `rank`'s consumer: its later requests speak for that rank."""
        self._consumers[peer] = (rank, consumer_id)

    def rank_of(self, peer: bytes) -> tuple[int, str] | None:
        """(rank, consumer id) the peer attached as; None: it did not attach."""
        return self._consumers.get(peer)

    def _forget_closed(self, peer: bytes) -> None:
        self._closed.forget(peer)
        self._closed_fd.pop(peer, None)
