"""Why a job failed: its one line, and the closed set of kinds a metric counts it under.

A job fails with one line of free text (a worker's refusal carries its transform's error in its own
words; a stall names hosts, processes and samples), and every rank hears that line from the dispatcher
over the wire. The line is kept whole where people read it (the log, `JobFailed`, the `--json`
summary); the `stoker_job_failed{reason}` label takes its kind instead, one of FAILURE_KINDS, read
from the shape the line makers below give it ("other" for any other line, a peer's made-up words
included): a label fed from free text would make a new series for every message."""

from __future__ import annotations

import re

REFUSED = "refused"
STALLED = "stalled"
DISPATCHER_GONE = "dispatcher_gone"
OTHER = "other"

# kind -> what it means, in words (`stoker status` prints these)
FAILURE_KINDS = {
    REFUSED: "a worker host refused the job (it cannot run the job's transform as pinned)",
    STALLED: "a rank waited past --stall-timeout for a batch it was owed",
    DISPATCHER_GONE: "the dispatcher stopped answering past --stall-timeout (rank 0 or `stoker dispatch` is gone)",
    OTHER: "a reason this Stoker does not know",
}


def refused_line(host_id: str, reason: str) -> str:
    """The job's line when a worker host refuses it (`reason`: one line, the worker's own words)."""
    return f"host {host_id} refused the job: {reason}"


def stalled_line(waited_s: float, timeout_s: float, stall: str) -> str:
    """The job's line when a rank has waited past the stall timeout (`stall`: the watchdog's one line)."""
    return f"no batch for {waited_s:.0f} s (--stall-timeout {timeout_s:g}): {stall}"


def dispatcher_gone_line(endpoint: str, silent_s: float, timeout_s: float) -> str:
    """A rank's line when its dispatcher has been silent past the stall timeout: what to do."""
    return (f"the dispatcher at {endpoint} has not answered for {silent_s:.0f} s (--stall-timeout {timeout_s:g} s): "
            f"rank 0 or the `stoker dispatch` process is gone; this rank stops. Start the job again from its last "
            f"checkpoint")


_SHAPES = (
    (REFUSED, re.compile(r"host .* refused the job: ", re.ASCII | re.DOTALL)),
    (STALLED, re.compile(r"no batch for \d+ s \(--stall-timeout [0-9.e+]+\): ", re.ASCII)),
    (DISPATCHER_GONE, re.compile(r"the dispatcher at \S+ has not answered for \d+ s \(--stall-timeout ", re.ASCII)),
)


def failure_kind(line: str) -> str:
    """The label value a job's failure line counts under: one of FAILURE_KINDS, "other" for anything else."""
    return next((kind for kind, shape in _SHAPES if shape.match(line)), OTHER)


def failed_line(kind: str) -> str:
    """`stoker status`'s line for a failed job, from its metric's label (a scraped page's: any text)."""
    return (f"the job failed: {FAILURE_KINDS.get(kind, kind)} (stoker_job_failed reason {kind}; its whole line is "
            f"in the log of its ranks and dispatcher)")
