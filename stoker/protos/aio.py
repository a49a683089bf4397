"""Small pieces shared by Stoker's event loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
import zmq.asyncio


async def pump(sock: zmq.asyncio.Socket, handle: Callable[[list], None], stop: threading.Event) -> None:
    """Hand every multipart message to `handle` until `stop` is set (checked 4 times a second)."""
    while not stop.is_set():
        try:
            frames = await asyncio.wait_for(sock.recv_multipart(copy=False), timeout=0.25)
        except TimeoutError:
            continue
        handle(frames)


async def pump_batches(sock: zmq.asyncio.Socket, handle_all: Callable[[list[list]], None], stop: threading.Event,
                       most: int = 256) -> None:
    """Like `pump`, but hands over every message already waiting (up to `most`) in one call, so
    that the handler can do once what each would do alone (the control server's journal sync)."""
    while not stop.is_set():
        try:
            batch = [await asyncio.wait_for(sock.recv_multipart(copy=False), timeout=0.25)]
        except TimeoutError:
            continue
        while len(batch) < most:
            try:
                batch.append(await sock.recv_multipart(flags=zmq.NOBLOCK, copy=False))
            except zmq.Again:
                break
        handle_all(batch)


async def run_until_one_fails(coroutines: list[Coroutine[Any, Any, None]], stop: threading.Event) -> None:
    """Run `coroutines` together until all end; the first that raises sets `stop`, the others are
    cancelled and awaited (their `finally` blocks close their sockets, without which the context's
    term() would wait for ever), and its exception is raised. asyncio.gather would leave them pending."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
