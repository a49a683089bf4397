"""The dispatcher's journal as a file (what ships: accel.control.journal) against SQLite (stdlib
`sqlite3`, WAL, `synchronous=FULL`, one transaction per group of requests), which the
"Durability and integrity" issue asked us to consider.

Both make the same events durable the way the control server does: a group of lease/ack lines,
then one commit (file: flush + fsync; SQLite: COMMIT, which fsyncs its WAL), and the answers only
after it. Measured in one run, alternating, so the ratio holds on a noisy disk: the seconds per
durable group at 1, 16 and 256 events (the control server reads up to 256 requests at once),
and the seconds to replay an epoch of 20,000 units (a lease and an ack each) on restart.
The SQLite store here is the benchmark's, written to measure, not shipped.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.report import header, write_results
from stoker.accel.control.journal import Journal

GROUPS = (1, 16, 256)
ROUNDS = 3
REPLAY_UNITS = 20_000
JOB = {"job_id": "bench", "manifest": "m.json"}


class SqliteJournal:
    """The same events in one SQLite table, a transaction per group."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, event TEXT NOT NULL)")
        self._group: list[tuple[str]] = []

    def lease(self, unit_id: int, host_id: str, worker_id: str) -> None:
        self._group.append((json.dumps({"lease": unit_id, "host": host_id, "worker": worker_id}),))

    def ack(self, unit_id: int, batches: int) -> None:
        self._group.append((json.dumps({"ack": unit_id, "batches": batches}),))

    def sync(self) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO events (event) VALUES (?)", self._group)
        self.db.execute("COMMIT")
        self._group.clear()

    def replay(self) -> tuple[set[int], dict[int, str]]:
        done, leases = set(), {}
        for (text,) in self.db.execute("SELECT event FROM events ORDER BY seq"):
            event = json.loads(text)
            if "lease" in event:
                leases[event["lease"]] = event["host"]
            else:
                done.add(event["ack"])
                leases.pop(event["ack"], None)
        return done, leases

    def close(self) -> None:
        self.db.close()


def _file_store(path: Path) -> Journal:
    return Journal(path, JOB, b"k" * 32)


def _group_seconds(store, size: int, groups: int) -> float:
    """Median seconds to make one group of `size` events durable."""
    times = []
    unit = 0
    for _ in range(groups):
        started = time.perf_counter()
        for _ in range(size):
            if unit % 2:
                store.ack(unit // 2, 4)
            else:
                store.lease(unit // 2, "h0", "h0/p0.1")
            unit += 1
        store.sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _replay_seconds(kind: str, folder: Path) -> float:
    path = folder / f"replay-{kind}"
    store = _file_store(path) if kind == "file" else SqliteJournal(path)
    for unit in range(REPLAY_UNITS):
        store.lease(unit, "h0", "h0/p0.1")
        store.ack(unit, 4)
        if unit % 256 == 255:
            store.sync()
    store.sync()
    store.close()
    started = time.perf_counter()
    if kind == "file":
        reopened = _file_store(path)
        assert len(reopened.replayed.done) == REPLAY_UNITS
        reopened.close()
    else:
        reopened = SqliteJournal(path)
        assert len(reopened.replay()[0]) == REPLAY_UNITS
        reopened.close()
    return time.perf_counter() - started


def main() -> None:
    result = header("journal_store")
    rows: dict[str, dict[str, list[float]]] = {"file": {}, "sqlite": {}}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:  # the disk the journal would be on, not tmpfs
        folder = Path(tmp)
        for round_ in range(ROUNDS):
            for kind in ("file", "sqlite"):
                for size in GROUPS:
                    path = folder / f"{kind}-{size}-{round_}"
                    store = _file_store(path) if kind == "file" else SqliteJournal(path)
                    seconds = _group_seconds(store, size, groups=max(20, 2000 // size))
                    store.close()
                    rows[kind].setdefault(f"group_{size}_ms", []).append(1e3 * seconds)
                replay_folder = folder / f"replay-{round_}"
                replay_folder.mkdir(exist_ok=True)
                rows[kind].setdefault("replay_s", []).append(_replay_seconds(kind, replay_folder))
    medians = {kind: {name: statistics.median(values) for name, values in figures.items()}
               for kind, figures in rows.items()}
    result["medians"] = medians
    result["rounds"] = rows
    lines = ["| store | " + " | ".join(f"{size}-event group, ms" for size in GROUPS)
             + f" | replay of {REPLAY_UNITS:,} units, s |", "|---" * (len(GROUPS) + 2) + "|"]
    for kind in ("file", "sqlite"):
        cells = [f"{medians[kind][f'group_{size}_ms']:.2f}" for size in GROUPS]
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {medians[kind]['replay_s']:.3f} |")
    ratio = [medians["sqlite"][f"group_{size}_ms"] / medians["file"][f"group_{size}_ms"] for size in GROUPS]
    lines.append("")
    lines.append("SQLite / file, per durable group: " + ", ".join(f"{r:.2f}x at {s}" for r, s in zip(ratio, GROUPS,
                                                                                                    strict=True))
                 + f"; replay {medians['sqlite']['replay_s'] / medians['file']['replay_s']:.2f}x (medians of {ROUNDS})")
    table = "\n".join(lines) + "\n"
    result["sqlite_over_file"] = dict(zip((str(s) for s in GROUPS), ratio, strict=True))
    print(table)
    write_results("journal_store", result, table)


if __name__ == "__main__":
    main()
