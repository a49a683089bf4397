"""Small pieces shared by Stoker's event loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import zmq.asyncio


async def pump(sock: zmq.asyncio.Socket, handle: Callable[[list], None], stop: threading.Event) -> None:
    """Hand every multipart message to `handle` until `stop` is set (checked 4 times a second)."""
    while not stop.is_set():
        try:
            frames = await asyncio.wait_for(sock.recv_multipart(copy=False), timeout=0.25)
        except TimeoutError:
            continue
        handle(frames)
