"""A host daemon's child processes: started, reaped (a crash restarted after its back-off), drained by a deadline.

The one supervisor of both the worker daemon's decode processes (workers.daemon) and the fleet agent's job
daemons (workers.fleet_agent). A child is a `Supervised` record (its process now, when it started, its
crashes in a row and when it may start again), which each daemon extends with what it knows of its own;
the supervisor says nothing itself: what to log, and when to restart, stays with the daemon. Every wait on
a process has a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

KILL_WAIT_S = 5.0  # a process killed (SIGKILL) is waited on this long at most; one already exited, at once


class Supervised:
    """One child: its process (None before its first start), when it last started, its crashes in a row
    (each within the supervisor's steady time of its start), and when it may start again after one."""

    def __init__(self) -> None:
        self.process: BaseProcess | None = None
        self.started = 0.0
        self.crashes = 0
        self.restart_at: float | None = None  # a crashed child waiting for its back-off


Child = TypeVar("Child", bound=Supervised)


@dataclass
class Drained:
    """What a drain waited for: the processes it told to stop (their names), and those of them it killed at
    its deadline."""

    waited: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)


class Supervisor:
    """`backoff`: the wait before a crashed child starts again, by its crashes in a row (the last one holds
    from there on); a child that ran `steady_s` before it crashed counts from one again. `on_exit`: called
    with each reaped process's pid (the worker daemon drops its metrics files)."""

    def __init__(self, ctx: SpawnContext, backoff: Sequence[float], steady_s: float,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.ctx = ctx
        self.backoff = tuple(backoff)
        self.steady_s = steady_s
        self.on_exit = on_exit

    def start(self, child: Supervised, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> BaseProcess:
        """Start the child's process (raises what `Process.start` raises: the host may have no room for it)."""
        process = self.ctx.Process(target=target, args=args, name=name, daemon=False)
        process.start()
        child.process, child.restart_at = process, None
        child.started = time.monotonic()
        return process

    def reap(self, child: Supervised) -> int | None:
        """The exit code of the child's process once it has exited (joined); None while it runs, or without one."""
        process = child.process
        if process is None or process.is_alive():
            return None
        process.join(KILL_WAIT_S)
        self._exited(process)
        return process.exitcode

    def crashed(self, child: Supervised) -> float:
        """Count the child's crash and set when it starts again; returns its back-off in seconds."""
        now = time.monotonic()
        child.crashes = child.crashes + 1 if now - child.started < self.steady_s else 1
        delay = self.backoff[min(child.crashes - 1, len(self.backoff) - 1)]
        child.restart_at = now + delay
        return delay

    def due(self, child: Supervised) -> bool:
        """A crashed child's back-off is over."""
        return child.restart_at is not None and time.monotonic() >= child.restart_at

    def kill(self, child: Supervised) -> None:
        """SIGKILL the child's process and wait for it (KILL_WAIT_S at most)."""
        if child.process is not None and child.process.is_alive():
            child.process.kill()
            child.process.join(KILL_WAIT_S)

    def drain(self, children: Iterable[Child], timeout_s: float,
              on_late: Callable[[Child], None] | None = None) -> Drained:
        """SIGTERM every child whose process runs, wait for them all until `timeout_s` from now, and kill
        each still running then (`on_late` first, to say so). Returns what it waited for and killed."""
        live = [c for c in children if c.process is not None and c.process.is_alive()]
        drained = Drained()
        for child in live:
            assert child.process is not None
            child.process.terminate()
            drained.waited.append(child.process.name)
        deadline = time.monotonic() + timeout_s
        for child in live:
            assert child.process is not None
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                if on_late is not None:
                    on_late(child)
                drained.killed.append(child.process.name)
                self.kill(child)
            self._exited(child.process)
        return drained

    def _exited(self, process: BaseProcess) -> None:
        if self.on_exit is not None and process.pid is not None:
            self.on_exit(process.pid)
