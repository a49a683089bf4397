"""Worker daemons started by this process on this machine: `stoker run`'s hosts, and the N worker
processes of `Loader(job, workers=N)` (the shape `DataLoader(num_workers=N)` users expect).

Each is a `stoker worker --once --parent-pid <this process>` child: it serves this job, leaves
when the job has finished, and dies with this process however that ends (the daemon watches
its parent, and its decode processes watch the daemon). Its stderr is passed through; its own
fatal line (`stoker: error: ...`) is held back and reported once, as the job's failure.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from stoker.accel.consumer import JobFailed

ERROR_PREFIX = "stoker: error: "  # how a stoker process says why it exits (stoker.cli.main)
CHILD_ERROR = re.compile(r"stoker(?: [a-z]+)?: error: ")  # ... and its parser (stoker.flags.Parser)
STOP_WAIT_S = 5.0  # after a terminate (then a kill), how long to wait for a daemon to be gone


def worker_command(connect: str, host_id: str, procs: int, metrics_port: int | None, log_level: str,
                   shard_cache_gb: float | None = None) -> list[str]:
    """The command line of a daemon that serves the job at `connect` once, then leaves, and dies with us
    (its flags from WorkerConfig's metadata: stoker.configured.command_line)."""
    from stoker.configured import command_line
    from stoker.workers.worker_config import WorkerConfig

    cfg = WorkerConfig(connect, procs=procs, host_id=host_id, metrics_port=metrics_port, once=True,
                       parent_pid=os.getpid(), shard_cache_gb=shard_cache_gb,
                       metrics_flag="--worker-metrics-port")  # the user's name for it, if it is taken
    return [sys.executable, "-m", "stoker", "--log-level", log_level, "worker", *command_line(cfg)]


def worker_environment() -> dict[str, str]:
    """This process's environment without the STOKER_* variables a `stoker worker` reads as its options:
    this job's daemons are told everything by their command line, not by settings meant for another's."""
    from stoker.settings import without_settings
    from stoker.workers.worker_config import WorkerConfig

    return without_settings(os.environ, WorkerConfig)


class DaemonProcess:
    """A `stoker` child whose stderr is passed through and its last lines kept, for the error.
    Its own fatal error line (`stoker: error: ...`) is held back: `failure` reports it, once."""

    def __init__(self, host_id: str, cmd: list[str], env: dict[str, str] | None = None, quiet: bool = False,
                 role: str = "worker daemon") -> None:
        """`quiet`: its standard output is not shown (a rank whose figures are read from its --json);
        `role`: what it is, in its error ("worker daemon host0", "rank 1")."""
        self.host_id = host_id
        self.name = f"{role} {host_id}"
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL if quiet else None,
                                     text=True, errors="replace", env=env)
        self.tail: collections.deque[str] = collections.deque(maxlen=5)
        self.error = ""  # its fatal error line, without the prefix
        self.reported = False
        self._reader = threading.Thread(target=self._relay, name=f"stoker-{host_id}-stderr", daemon=True)
        self._reader.start()

    def _relay(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            said = CHILD_ERROR.match(line)
            if said:
                self.error = line[said.end():].strip()
                continue
            sys.stderr.write(line)
            if line.strip():
                self.tail.append(line.strip())

    def failure(self) -> str | None:
        """Why the daemon ended early: None while it runs or after a clean exit."""
        code = self.proc.poll()
        if code is None or code == 0:
            return None
        self._reader.join(timeout=2)
        self.reported = True
        if self.error:
            return f"{self.name} exited with code {code}: {self.error}"
        if code < 0:  # a signal: its last log line says nothing about why it was killed
            return f"{self.name} was killed by {_signal_name(-code)}"
        return f"{self.name} exited with code {code}: {self.tail[-1] if self.tail else '(no output)'}"

    def unreported_error(self) -> str | None:
        """Its fatal error, when the run ended before `failure` reported it."""
        return None if self.reported or not self.error else f"{self.name}: {self.error}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def watch_daemons(daemons: list[DaemonProcess], abort: Callable[[BaseException], None],
                  done: threading.Event) -> threading.Thread:
    """A thread that ends the job (`abort`) with the first daemon's failure: it cannot deliver its share."""
    def watch() -> None:
        while not done.wait(0.2):
            for daemon in daemons:
                failure = daemon.failure()
                if failure is not None:
                    abort(JobFailed(failure))
                    return

    thread = threading.Thread(target=watch, name="stoker-daemon-watch", daemon=True)
    thread.start()
    return thread


def stop_daemons(daemons: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """Give the daemons `timeout_s` to leave by themselves (a --once daemon does once the job has
    finished), then terminate them, then kill those still there; waits at most STOP_WAIT_S more each."""
    deadline = time.monotonic() + timeout_s
    for proc in daemons:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
    for proc in daemons:
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                print(f"stoker: worker daemon {proc.pid} did not exit after SIGKILL within {STOP_WAIT_S:.0f} s",
                      file=sys.stderr)
