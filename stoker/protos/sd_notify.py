"""systemd's readiness and watchdog protocol (sd_notify(3)): one datagram per state change.

Under a `Type=notify` unit systemd sets NOTIFY_SOCKET; elsewhere every call is a no-op, so
the daemons call these unconditionally. The watchdog ping is rate-limited to a quarter of
WATCHDOG_USEC, so a loop may call it every iteration.
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self) -> None:
        self.address = os.environ.get("NOTIFY_SOCKET", "")
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        owned = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 4e6 if usec.isdigit() and owned else None
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, state: str) -> None:
        if not self.address:
            return
        address = "\0" + self.address[1:] if self.address.startswith("@") else self.address  # abstract namespace
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(state.encode(), address)
            except OSError:
                pass  # systemd gone or the socket unreachable: nothing to tell

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self) -> None:
        if self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")
