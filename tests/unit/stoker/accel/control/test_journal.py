"""The journal after a crash at any point of any write: what was answered survives two restarts,
a torn tail is cut before anything is appended, and one dispatcher at a time holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stoker.accel.control.journal import Journal, JournalInUse, replay
from tests.journal_crash import arm

JOB = {"job_id": "j1", "manifest": "m.json"}
KEY = b"k" * 32

# One dispatcher's history: leases, acks, a release, a compaction, and the syncs the control server
# makes before it answers.
OPS: list[tuple] = [
    ("lease", 0, "h0"), ("lease", 1, "h1"), ("sync",), ("ack", 0), ("lease", 2, "h0"), ("sync",),
    ("release", [1]), ("lease", 1, "h0"), ("sync",), ("ack", 2), ("ack", 1), ("sync",), ("compact",),
    ("lease", 3, "h1"), ("ack", 3), ("sync",), ("lease", 4, "h0"), ("sync",), ("ack", 4), ("sync",),
]
EVENTS = sum(op[0] in ("lease", "ack", "release") for op in OPS)


def _state(ops: list[tuple]) -> tuple:
    """What a replay of these operations must give: units done, leases open (unit -> host)."""
    done, leases = set(), {}
    for op in ops:
        if op[0] == "lease":
            leases[op[1]] = op[2]
        elif op[0] == "ack":
            done.add(op[1])
            leases.pop(op[1], None)
        elif op[0] == "release":
            for unit in op[1]:
                leases.pop(unit, None)
    return frozenset(done), leases


def _replayed(journal: Journal) -> tuple:
    r = journal.replayed
    return (frozenset(r.done) | frozenset(range(r.done_below)), {u: lease[0] for u, lease in r.leases.items()})


def _apply(journal: Journal, ops: list[tuple], applied: list[tuple]) -> None:
    for op in ops:
        if op[0] == "lease":
            journal.lease(op[1], op[2], f"{op[2]}/p0.1")
        elif op[0] == "ack":
            journal.ack(op[1], 2)
        elif op[0] == "release":
            journal.release(op[1])
        elif op[0] == "sync":
            journal.sync()
        elif op[0] == "compact":
            done, leases = _state(applied)
            journal.compact({"done_below": 0, "done": sorted(done), "batches": {},
                             "leases": [[u, h, f"{h}/p0.1", 0, ""] for u, h in leases.items()]})
        applied.append(op)


def _events(ops: list[tuple]) -> list[tuple]:
    return [op for op in ops if op[0] in ("lease", "ack", "release")]


def _crashing_run(path: Path, start: int, crash_at: int | None) -> tuple[int, int]:
    """Apply OPS[start:] to the journal in a child process that SIGKILLs itself at write point
    `crash_at`; returns the events (of all OPS) answered and written when it died: answered = made
    durable by a sync."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a dispatcher that dies mid-write
        os.close(read)
        try:
            arm(crash_at)
            journal = Journal(path, JOB, KEY)
            applied: list[tuple] = list(OPS[:start])
            for op in OPS[start:]:
                _apply(journal, [op], applied)
                written = len(_events(applied))
                answered = written if op[0] in ("sync", "compact") else None
                os.write(write, f"{written} {'' if answered is None else answered}\n".encode())
            journal.close()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reports:
        lines = reports.read().split("\n")
    os.waitpid(pid, 0)
    answered = written = len(_events(OPS[:start]))  # durable before this run
    for line in filter(None, lines):
        parts = line.split(" ")
        written = int(parts[0])
        if parts[1]:
            answered = int(parts[1])
    return answered, written + 1  # the event being written when it died may be whole on disk


def _points(path: Path, start: int) -> int:
    """How many write points a crash-free run of OPS[start:] passes (on a fresh journal)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            passed = arm(None)
            journal = Journal(path, JOB, KEY)
            _apply(journal, OPS[start:], list(OPS[:start]))
            journal.close()
            os.write(write, str(len(passed)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as out:
        count = int(out.read())
    os.waitpid(pid, 0)
    return count


def _recover_and_check(path: Path, ops: list[tuple], answered: int, written: int) -> int:
    """A restart: the replay holds every answered event and nothing but a prefix of the history;
    returns how many of `ops` it holds (where the next run continues)."""
    journal = Journal(path, JOB, KEY)
    try:
        got = _replayed(journal) if journal.replayed else (frozenset(), {})
    finally:
        journal.close()
    events = _events(ops)
    prefixes = [n for n in range(answered, min(written, len(events)) + 1) if _state(events[:n]) == got]
    assert prefixes, f"the replay {got} is no prefix of the history between {answered} and {written} events"
    n = prefixes[-1]
    # continue after the n-th event (and any sync/compact right after it)
    index = 0
    seen = 0
    while index < len(ops) and (seen < n or ops[index][0] in ("sync", "compact")):
        seen += ops[index][0] in ("lease", "ack", "release")
        index += 1
    return index


def test_a_crash_at_every_write_point_keeps_every_answered_event_through_two_restarts(tmp_path):
    total = _points(tmp_path / "count", 0)
    assert total >= 2 * EVENTS + 8  # every line (inside, after), the syncs, the creation and compaction renames
    for point in range(total):
        path = tmp_path / f"j{point}"
        answered, written = _crashing_run(path, 0, point)
        resume_at = _recover_and_check(path, OPS, answered, written)  # restart 1
        if resume_at < len(OPS):  # the restarted dispatcher dies too, at a point of its own run
            second_point = point % max(1, _points(tmp_path / f"c{point}", resume_at) - 1)
            resume_at = _recover_and_check(path, OPS, *_crashing_run(path, resume_at, second_point))
        journal = Journal(path, JOB, KEY)  # restart 2: finishes the history
        _apply(journal, OPS[resume_at:], list(OPS[:resume_at]))
        journal.close()
        final = Journal(path, JOB, KEY)
        assert _replayed(final) == _state(OPS), f"crash at write point {point}: the history differs"
        final.close()


def _journal_with(tmp_path: Path, ops: list[tuple]) -> Path:
    path = tmp_path / "j"
    journal = Journal(path, JOB, KEY)
    _apply(journal, ops, [])
    journal.close()
    return path


@pytest.mark.parametrize("last", [("lease", 9, "h1"), ("ack", 3), ("release", [4])], ids=["lease", "ack", "release"])
def test_a_last_line_torn_at_every_byte_is_cut_and_the_next_events_survive_two_restarts(tmp_path, last):
    before = [("lease", 3, "h0"), ("lease", 4, "h1"), ("sync",), ("compact",), ("lease", 5, "h0"), ("sync",)]
    whole = _journal_with(tmp_path, [*before, last, ("sync",)]).read_bytes()
    record = len(whole) - whole.rstrip(b"\n").rfind(b"\n") - 1
    for cut in range(1, record):  # a torn line: from one byte to all but its newline
        path = tmp_path / f"cut{cut}"
        path.write_bytes(whole[: len(whole) - record + cut])
        path.chmod(0o600)
        journal = Journal(path, JOB, KEY)
        assert _replayed(journal) == _state(before), f"cut at byte {cut} of the last record"
        journal.lease(7, "h2", "h2/p0.1")
        journal.close()
        for _ in range(2):
            again = Journal(path, JOB, KEY)
            assert _replayed(again) == _state([*before, ("lease", 7, "h2")])
            again.close()
        assert path.read_text().endswith('"key":""}\n')


def test_a_journal_without_a_whole_line_is_refused_not_started_anew(tmp_path):
    """A new journal comes into place whole (rename), so a torn header is damage: starting anew would
    give the job another id and strand every worker and rank that knows the old one."""
    path = tmp_path / "j"
    path.write_bytes(b'{"job":{"job_id":"j1","man')
    path.chmod(0o600)
    with pytest.raises(ValueError, match="without one whole line"):
        Journal(path, JOB, KEY)


@pytest.mark.parametrize("damage", [b"garbage\n", b"42\n", b'{"lease":"x"}\n', b'{"release":7}\n'],
                         ids=["garbage", "a-number", "a-bad-lease", "a-bad-release"])
def test_a_whole_line_that_is_no_event_is_refused_with_its_number(tmp_path, damage):
    path = _journal_with(tmp_path, [("lease", 3, "h0"), ("sync",)])
    with open(path, "ab") as out:
        out.write(damage)
    with pytest.raises(ValueError, match=r":3: not a journal line"):
        Journal(path, JOB, KEY)


def test_a_journal_another_user_could_have_written_or_named_is_refused(tmp_path):
    path = _journal_with(tmp_path, [("lease", 3, "h0"), ("sync",)])
    path.chmod(0o644)
    with pytest.raises(ValueError, match="mode 0644"):
        Journal(path, JOB, KEY)
    path.chmod(0o600)
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(ValueError, match="symbolic link"):
        Journal(tmp_path / "link", JOB, KEY)
    os.link(path, tmp_path / "second-name")
    with pytest.raises(ValueError, match="2 names"):
        Journal(path, JOB, KEY)
    os.unlink(tmp_path / "second-name")
    if os.geteuid() == 0:  # another uid: root can hand the files to nobody
        os.chown(path, 65534, 65534)
        with pytest.raises(ValueError, match="belongs to uid 65534"):
            Journal(path, JOB, KEY)
        os.chown(path, 0, 0)
        os.chown(tmp_path / "j.lock", 65534, 65534)
        with pytest.raises(JournalInUse, match="lock .* belongs to uid 65534"):
            Journal(path, JOB, KEY)


def test_a_planted_staging_name_is_never_written_through(tmp_path):
    """The staged copy of a new or compacted journal has a random name (mkstemp: O_EXCL): a file or
    link planted under the old fixed name stays as it was."""
    planted = tmp_path / "j.staged"
    planted.write_text("theirs")
    path = _journal_with(tmp_path, [("lease", 3, "h0"), ("sync",), ("compact",)])
    assert planted.read_text() == "theirs"
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_journal_of_another_job_names_what_differs(tmp_path):
    Journal(tmp_path / "j", JOB, KEY).close()
    with pytest.raises(ValueError, match=r"manifest: journal 'm.json', now 'other.json'"):
        Journal(tmp_path / "j", {"job_id": "j2", "manifest": "other.json"}, KEY)


def test_a_second_dispatcher_on_the_same_journal_is_refused_until_the_first_dies(tmp_path):
    path = tmp_path / "j"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from stoker.accel.control.journal import Journal
        j = Journal({str(path)!r}, {JOB!r}, {KEY!r})
        print("open", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[5])
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(JournalInUse, match=rf"in use by another dispatcher \(pid {holder.pid}\)"):
            Journal(path, JOB, KEY)
        assert replay(path).job == JOB  # the refused one wrote nothing
    finally:
        holder.kill()
        holder.wait()
    Journal(path, JOB, KEY).close()  # the kernel dropped the dead holder's lock


@pytest.mark.parametrize("compacted", [False, True])
def test_a_dispatcher_whose_lock_file_was_removed_still_holds_the_journal(tmp_path, compacted):
    """`rm j.lock` while a dispatcher runs (a clean-up script, a user): a second dispatcher is refused all
    the same, before and after a compaction replaced the journal's file (it used to start, and both leased
    the same units)."""
    path = tmp_path / "j"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from stoker.accel.control.journal import Journal
        j = Journal({str(path)!r}, {JOB!r}, {KEY!r})
        j.lease(1, "h0", "h0/p0.1")
        j.sync()
        if {compacted!r}:
            j.compact({{"done_below": 0, "done": [1], "batches": {{}}, "leases": []}})
        print("open", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[5])
    try:
        assert holder.stdout.readline().strip() == "open"
        (tmp_path / "j.lock").unlink()
        with pytest.raises(JournalInUse, match="its lock file was removed, but the journal itself is held"):
            Journal(path, JOB, KEY)
        assert replay(path).done == ({1} if compacted else set())  # the refused one wrote nothing
    finally:
        holder.kill()
        holder.wait()
    Journal(path, JOB, KEY).close()  # the kernel dropped the dead holder's locks
