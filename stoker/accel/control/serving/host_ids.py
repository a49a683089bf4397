"""Which daemon owns each host id: a daemon heard within DAEMON_LIVE_BEATS heartbeats holds its host id
against another. Two daemons under one id would take each other's leases back; a daemon that
restarted is let in once its predecessor is silent. Pure state on an injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stoker.accel.control.serving.last_heard import LastHeard
from stoker.protos.leases import HOST_ID_IN_USE

DAEMON_LIVE_BEATS = 3  # a daemon heard within this many heartbeat periods holds its host id against another
MOST_HOSTS = 4096  # host ids whose daemon is kept: a flood of made-up ids cannot grow it


class HostIds:
    def __init__(self, heartbeat_s: float, now: Callable[[], float] = time.monotonic,
                 most: int = MOST_HOSTS) -> None:
        self.window_s = DAEMON_LIVE_BEATS * heartbeat_s
        self.now = now
        self._heard = LastHeard[str](limit=most)  # host -> when its daemon was last heard
        self._daemon: dict[str, bytes] = {}  # host -> its daemon (the peer that speaks as it)

    def taken(self, host_id: str, peer: bytes) -> str:
        """Why `peer` may not speak as the daemon of `host_id` ("": it may, and is now heard as it)."""
        now = self.now()
        known, age = self._daemon.get(host_id), self._heard.age(host_id, now)
        if known is not None and age is not None and known != peer and age < self.window_s:
            return (f"host id {host_id} {HOST_ID_IN_USE} (its daemon was heard {age:.1f} s ago): "
                    f"give each worker daemon its own --host-id")
        self._daemon[host_id] = peer
        forgotten = self._heard.record(host_id, now)
        if forgotten is not None:
            del self._daemon[forgotten]
        return ""

    def __len__(self) -> int:
        return len(self._heard)
