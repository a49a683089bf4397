"""The dispatcher's append-only journal: a restarted dispatcher continues the epoch.

One JSON object per line: the job it belongs to (and the key lease tokens are signed with)
first, then every lease, ack and release.
Each line is flushed and fsync'd before the dispatcher answers the request that caused it,
so whatever a worker or the consumer was told survives a crash. Replaying gives the units
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
        try:
            self._file = open(self.path, "a")
        except OSError as exc:
            raise OSError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from exc
        if self.replayed is None:
            self.path.chmod(0o600)  # it holds the lease key
            self._write({"job": job, "lease_key": lease_key.hex()})

    def _write(self, event: dict) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def lease(self, unit_id: int, host_id: str, worker_id: str, request_id: int = 0, key: str = "") -> None:
        self._write({"lease": unit_id, "host": host_id, "worker": worker_id, "request": request_id, "key": key})

    def ack(self, unit_id: int, batches: int | None = None) -> None:
        self._write({"ack": unit_id} if batches is None else {"ack": unit_id, "batches": batches})

    def release(self, unit_ids: list[int]) -> None:
        self._write({"release": unit_ids})

    def close(self) -> None:
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
        if "lease" in event:
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
