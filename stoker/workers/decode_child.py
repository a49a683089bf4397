"""A decode process as its daemon (workers.daemon) sees it, and the watch on it: one that is stopped (SIGSTOP,
a debugger) or stuck in a transform past its time limit is killed, so that its units are redone elsewhere.
"""

from __future__ import annotations

import logging
import signal
import time

from stoker.pipeline.activity import ActivitySlot, Phase
from stoker.pipeline.job import JobConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient, DispatcherUnreachable
from stoker.workers.supervisor import Supervised

log = logging.getLogger("stoker.worker")

STOPPED_KILL_S = 5.0  # a process stopped (SIGSTOP, a debugger) this long is killed: its units are redone elsewhere
STUCK_GRACE_S = 5.0  # a transform still on one sample this long past --transform-timeout did not answer its
# time limit (its signal is blocked inside C code): the process is killed


class DecodeChild(Supervised):
    """One of the daemon's process slots (`index`), over its incarnations."""

    def __init__(self, index: int, incarnation: int = 0) -> None:
        super().__init__()
        self.index = index
        self.incarnation = incarnation  # counted across jobs and runs: a worker id is never used twice
        self.finished = False
        self.activity: ActivitySlot | None = None  # what its process is doing (pipeline.activity), one per index
        self.stopped_since: float | None = None  # its process was seen stopped (state T) since then
        self.retire_by: float | None = None  # told to drain (the fleet moved it to another job): killed past this
        self.stuck_on: int | None = None  # the sample it was killed in, past the time limit (None: none)
        self.short = 0  # starts in a row that failed for want of a process or thread (workers.limits)

    def watched(self) -> bool:
        """Its process runs its course: started, not finished, not waiting to start again."""
        return self.process is not None and not self.finished and self.restart_at is None


def kill_if_frozen(child: DecodeChild, host_id: str, worker_id: str) -> None:
    """A process stopped (SIGSTOP, SIGTSTP, a debugger's stop) holds its units and sends nothing, while
    its daemon heartbeats for it: past STOPPED_KILL_S it is killed, so its units are re-leased at once
    (its connections close) and it restarts like any crashed process."""
    proc = child.process
    if proc is None or not child.watched() or proc.pid is None:
        return
    if not stopped(proc.pid):
        child.stopped_since = None
        return
    now = time.monotonic()
    if child.stopped_since is None:
        child.stopped_since = now
    elif now - child.stopped_since >= STOPPED_KILL_S:
        log.warning("%s: process %s (pid %s) has been stopped (SIGSTOP or a debugger) for %.0f s while holding "
                    "its units; killing it so that they are redone", host_id, worker_id, proc.pid,
                    now - child.stopped_since)
        child.stopped_since = None
        proc.kill()


def watch_transform(child: DecodeChild, job: JobConfig, host_id: str, worker_id: str, run_id: str,
                    client: ControlClient) -> None:
    """A process cuts a transform call short at --transform-timeout and reports the sample itself; one
    still on that sample STUCK_GRACE_S later does not answer its time limit (its signal is blocked
    inside C code, or the transform ignores, disarms or keeps swallowing it; or it hangs in `crop`,
    which the limit does not cover). It is reported here, so the
    dispatcher skips the sample from now on, then killed: its unit, leased again, no longer holds that sample."""
    proc, slot = child.process, child.activity
    if slot is None or proc is None or not child.watched() or child.stuck_on is not None:
        return
    now = slot.read()
    if now.phase != Phase.TRANSFORMING or now.for_s < job.transform_timeout_s + STUCK_GRACE_S or \
            not proc.is_alive():
        return
    log.error("%s: process %s (pid %s) has been transforming sample %d of unit %d for %.0f s and does not answer "
              "--transform-timeout %g s (stuck in C code with its signals blocked, or it ignores or swallows its "
              "time limit): killing it; the sample is skipped from now on and its units go back without it",
              host_id, worker_id, proc.pid, now.sample_id, now.unit_id, now.for_s, job.transform_timeout_s)
    hung = pb.SampleHung(host_id=host_id, worker_id=worker_id, unit_id=max(now.unit_id, 0),
                         sample_id=now.sample_id, seconds=now.for_s, stuck=True, run_id=run_id)
    try:
        client.request(pb.ControlRequest(hung=hung), give_up_after_s=5.0)
    except DispatcherUnreachable as exc:
        log.warning("%s: could not tell the dispatcher that sample %d is stuck (%s)", host_id,
                    now.sample_id, exc)
    child.stuck_on = now.sample_id
    proc.kill()


def exit_name(exitcode: int | None) -> str:
    """`exit code 3`, or the signal that killed it by name (`SIGSEGV`)."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def stopped(pid: int) -> bool:
    """The process is stopped (state T or t in /proc/PID/stat); False when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] in ("T", "t")
