"""The dispatcher's append-only journal: a restarted dispatcher continues the epoch.

One JSON object per line: the job it belongs to (and the key lease tokens are signed with)
first, then every lease, ack and release.
Lines are written as they happen and made durable in groups (`sync`: one flush and fsync for
every line since the last): the control server syncs once per batch of requests it has read,
before it sends any of their answers, so whatever a worker or the consumer was told survives
a crash, and one fsync serves many leases (group commit).

When an epoch is done the dispatcher compacts the journal (`compact`): its history is
replaced, atomically, by a snapshot of what a restart needs (the units done, as a count of
whole epochs plus the ids of the open ones; the open leases), so neither the file nor the
time to replay it grows with the epoch number. Replaying gives the units
already done and the leases still open (their hosts get one host timeout to show up again
before the units go back to the queue).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Replayed:
    job: dict
    lease_key: bytes = b""
    done_below: int = 0  # every unit id below this is done (whole epochs, from a snapshot)
    done: set[int] = field(default_factory=set)
    batches: dict[int, int] = field(default_factory=dict)  # unit -> batches it gave
    leases: dict[int, tuple[str, str, int, str]] = field(default_factory=dict)  # unit -> (host, worker, request, key)


class Journal:
    def __init__(self, path: str | Path, job: dict, lease_key: bytes) -> None:
        """`lease_key`: used for a new journal; a replayed one keeps its own."""
        self.path = Path(path)
        self.replayed: Replayed | None = replay(self.path) if self.path.exists() else None
        if self.replayed is not None:
            theirs = {k: v for k, v in self.replayed.job.items() if k != "job_id"}
            ours = {k: v for k, v in job.items() if k != "job_id"}
            if theirs != ours:
                raise ValueError(f"{self.path} is the journal of another job ({theirs}), not {ours}")
            lease_key = self.replayed.lease_key or lease_key
        self.lease_key = lease_key
        self._header = {"job": self.replayed.job if self.replayed else job, "lease_key": lease_key.hex()}
        self._dirty = False
        self.compactions = 0  # since this process opened it
        try:
            self._file = open(self.path, "a")
        except OSError as exc:
            raise OSError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from exc
        if self.replayed is None:
            self.path.chmod(0o600)  # it holds the lease key
            self._write(self._header)
            self.sync()

    def _write(self, event: dict) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._dirty = True

    def sync(self) -> bool:
        """Make every line written so far durable; call before answering what they record.
        True when there was something to make durable (an fsync happened)."""
        if not self._dirty:
            return False
        self._file.flush()
        os.fsync(self._file.fileno())
        self._dirty = False
        return True

    @property
    def size(self) -> int:
        """Bytes in the journal, the lines not yet synced included."""
        return self._file.tell()

    def lease(self, unit_id: int, host_id: str, worker_id: str, request_id: int = 0, key: str = "") -> None:
        self._write({"lease": unit_id, "host": host_id, "worker": worker_id, "request": request_id, "key": key})

    def ack(self, unit_id: int, batches: int | None = None) -> None:
        self._write({"ack": unit_id} if batches is None else {"ack": unit_id, "batches": batches})

    def release(self, unit_ids: list[int]) -> None:
        self._write({"release": unit_ids})

    def compact(self, snapshot: dict) -> None:
        """Replace the history by `snapshot` (Dispatcher.snapshot): written beside, fsync'd, then
        renamed over the journal, so a crash at any point leaves the old journal or the new one."""
        staged = self.path.with_name(self.path.name + ".compacting")
        with open(staged, "w") as out:
            out.write(json.dumps(self._header, separators=(",", ":")) + "\n")
            out.write(json.dumps({"snapshot": snapshot}, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        staged.chmod(0o600)
        self._file.close()
        os.replace(staged, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself is durable
        finally:
            os.close(folder)
        self._file = open(self.path, "a")
        self._dirty = False
        self.compactions += 1

    def close(self) -> None:
        self.sync()
        self._file.close()


def replay(path: Path) -> Replayed:
    lines = path.read_text().splitlines()
    if not lines:
        raise ValueError(f"{path}: an empty journal")
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except ValueError:
            if number == len(lines):  # a torn last line: the crash hit mid-write, before any answer
                break
            raise ValueError(f"{path}:{number}: not a journal line") from None
    if "job" not in events[0]:
        raise ValueError(f"{path}: does not start with its job")
    state = Replayed(job=events[0]["job"], lease_key=bytes.fromhex(events[0].get("lease_key", "")))
    for event in events[1:]:
        if "snapshot" in event:
            snap = event["snapshot"]
            state.done_below, state.done = snap["done_below"], set(snap["done"])
            state.batches = {int(unit): batches for unit, batches in snap["batches"].items()}
            state.leases = {unit: (host, worker, request, key) for unit, host, worker, request, key in snap["leases"]}
        elif "lease" in event:
            state.leases[event["lease"]] = (event["host"], event["worker"], event.get("request", 0),
                                            event.get("key", ""))
        elif "ack" in event:
            state.done.add(event["ack"])
            if "batches" in event:
                state.batches[event["ack"]] = event["batches"]
            state.leases.pop(event["ack"], None)
        elif "release" in event:
            for unit in event["release"]:
                state.leases.pop(unit, None)
    return state
