"""Crash points for the dispatcher's journal, for the tests: the process SIGKILLs itself at the
n-th point where the journal writes (inside a line's write, after it, before one of its fsyncs,
before or after one of its renames; the process's other files do not count), so a test can stop
a real writer at every one of them.

Also a launcher: `python -m tests.journal_crash N [KIND] -- <stoker arguments>` runs stoker with
the crash armed at point N (counted from the dispatcher's start, over the points of KIND only
when given).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from stoker.accel.control import journal as journal_module

KINDS = ("inside a line", "after a line", "before an fsync", "before a rename", "after a rename")


def arm(crash_at: int | None, only: str | None = None) -> list[str]:
    """Patch this process's journal writes to die at point `crash_at` (counting only the points of
    kind `only`, when given); returns the list the points passed get appended to (their kinds)."""
    passed: list[str] = []

    def point(kind: str) -> bool:
        counted = [p for p in passed if only is None or p == only]
        if crash_at is not None and (only is None or kind == only) and len(counted) == crash_at:
            return True
        passed.append(kind)
        return False

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    original_write = journal_module.Journal._write
    real_fsync, real_replace = os.fsync, os.replace
    inside = [0]  # > 0 while the journal works: only its own fsyncs and renames are points

    def journal_work(function):
        def wrapped(*args, **kwargs):
            inside[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                inside[0] -= 1
        return wrapped

    journal_module.Journal.sync = journal_work(journal_module.Journal.sync)
    journal_module.Journal._put_in_place = journal_work(journal_module.Journal._put_in_place)
    journal_module._recover = journal_work(journal_module._recover)

    def write(self, event: dict) -> None:
        if point(KINDS[0]):
            line = json.dumps(event, separators=(",", ":")) + "\n"
            self._file.write(line[: max(1, len(line) // 2)])
            self._file.flush()
            die()
        original_write(self, event)
        if point(KINDS[1]):
            self._file.flush()  # what a killed process leaves: the bytes it wrote are in the page cache
            die()

    def fsync(fd: int) -> None:
        if inside[0] and point(KINDS[2]):
            die()
        real_fsync(fd)

    def replace(src, dst) -> None:
        if inside[0] and point(KINDS[3]):
            die()
        real_replace(src, dst)
        if inside[0] and point(KINDS[4]):
            die()

    journal_module.Journal._write = write
    os.fsync, os.replace = fsync, replace
    return passed


if __name__ == "__main__":
    split = sys.argv.index("--")
    arm(int(sys.argv[1]), sys.argv[2] if split > 2 else None)
    rest = sys.argv[split + 1:]
    from stoker.cli import main

    raise SystemExit(main(rest))
