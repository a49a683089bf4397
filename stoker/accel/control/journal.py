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

A crash can stop a write anywhere. Every answer waits for its lines' fsync, so a torn last line
(and anything after the last newline) records nothing anyone was told: opening the journal cuts
it off before appending, and a journal whose header never became a whole line is made anew.
A new journal and a compacted one come into place by rename, whole. One dispatcher at a time,
because two would lease the same units twice: the journal's own file is locked (flock, released
by the kernel when its holder dies), and a compacted one is locked before it is renamed into
place, so whatever file the path names is held; deleting a file cannot undo that (`PATH.lock`,
held too, says which pid holds the journal, and keeps two dispatchers from creating one at once).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stoker.protos.errors import DataError, ResourceError, StateError

log = logging.getLogger("stoker.journal")


class JournalInUse(StateError):
    """Another live process has the journal open."""


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
        self._lock = _lock(self.path)
        self._held: int | None = None  # the journal file's own lock (an open descriptor of it)
        try:
            self._held = _lock_journal(self.path)
            self.replayed: Replayed | None = _recover(self.path)
            if self.replayed is not None:
                theirs = {k: v for k, v in self.replayed.job.items() if k != "job_id"}
                ours = {k: v for k, v in job.items() if k != "job_id"}
                if theirs != ours:
                    differ = "; ".join(f"{k}: journal {theirs.get(k)!r}, now {ours.get(k)!r}"
                                       for k in sorted(theirs.keys() | ours.keys()) if theirs.get(k) != ours.get(k))
                    raise DataError(f"{self.path} is the journal of another job ({differ}); give another --journal "
                                     f"or remove it to start this job from its beginning")
                lease_key = self.replayed.lease_key or lease_key
            self.lease_key = lease_key
            self._header = {"job": self.replayed.job if self.replayed else job, "lease_key": lease_key.hex()}
            if self.replayed is None:
                self._hold(self._put_in_place([self._header]))
            self._file = open(self.path, "a")
        except OSError as exc:
            self._unlock()
            raise ResourceError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from exc
        except BaseException:
            self._unlock()
            raise
        self._dirty = False
        self.compactions = 0  # since this process opened it

    def _write(self, event: dict) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._dirty = True

    def sync(self) -> bool:
        """Make every line written so far durable; call before answering what they record.
        True when there was something to make durable (an fsync happened)."""
        if not self._dirty:
            return False
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise JournalWriteError(self.path, exc) from exc
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
        """Replace the history by `snapshot` (Dispatcher.snapshot): a crash at any point of it
        leaves the old journal or the new one."""
        self._file.close()
        try:
            self._hold(self._put_in_place([self._header, {"snapshot": snapshot}]))
        except OSError as exc:  # the old journal stands, whole: keep it open for close() and say why
            self._file = open(self.path, "a")
            raise JournalWriteError(self.path, exc) from exc
        self._file = open(self.path, "a")
        self._dirty = False
        self.compactions += 1

    def _hold(self, fd: int) -> None:
        """The journal file is now the one `fd` locks: let the lock of the one it replaced go."""
        if self._held is not None:
            os.close(self._held)
        self._held = fd

    def _unlock(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None
        os.close(self._lock)

    def _put_in_place(self, events: list[dict]) -> int:
        """Write `events` as the whole journal: beside it, fsync'd, owner-only (it holds the lease
        key), locked, then renamed over it and the rename made durable. Returns the descriptor that
        holds the new file's lock (the caller keeps it: `_hold`)."""
        fd, staged = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")  # O_EXCL, 0600
        held = os.dup(fd)  # one open file: its lock outlives `out` below
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file nobody else has seen yet
        try:
            with os.fdopen(fd, "w") as out:
                for event in events:
                    out.write(json.dumps(event, separators=(",", ":")) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(staged, self.path)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            os.close(held)
            raise
        _fsync_folder(self.path.parent)
        return held

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.sync()
            self._file.close()
        finally:
            self._unlock()


def _lock(path: Path) -> int:
    """Hold `PATH.lock` for as long as the journal is open; refuse when another process holds it."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ResourceError(f"cannot lock the journal {path} ({lock_path}: {exc.strerror or exc})") from exc
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise JournalInUse(f"the journal's lock {lock_path} belongs to uid {owner}, not to you: another user could "
                           f"hold it or plant a journal beside it; keep the journal in a folder of your own")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise JournalInUse(f"the journal {path} is in use by another dispatcher (pid {holder}); two dispatchers on "
                           f"one journal would lease the same units twice") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_journal(path: Path) -> int | None:
    """Lock the journal file itself (None: there is none yet); JournalInUse when a dispatcher holds it.
    The lock is the file's, not the path's: a journal compacted meanwhile is another file, so the path
    must still name the file locked, else the new one is tried."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # none yet; or a path that is no journal of ours, which _recover names
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalInUse(f"the journal {path} is in use by another dispatcher (its lock file was removed, "
                               f"but the journal itself is held); two dispatchers on one journal would lease the "
                               f"same units twice") from None
        try:
            here = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        held = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)


def _recover(path: Path) -> Replayed | None:
    """Replay the journal at `path`, first cutting off what a crash tore (nothing anyone was told);
    None when there is no journal yet, or none that ever became whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = "is a symbolic link (give the journal's own path)" if path.is_symlink() else (exc.strerror or exc)
        raise DataError(f"the journal {path} {reason}") from exc
    with os.fdopen(fd, "rb") as file:
        _check_ours(path, os.fstat(file.fileno()))
        data = file.read()
    whole = data.rfind(b"\n") + 1
    if whole == 0:  # a new journal comes into place whole, by rename: this one was damaged, not torn
        raise DataError(f"{path}: a journal without one whole line (damaged, or not a journal); remove it to "
                         f"start the job from its beginning")
    if whole < len(data):
        log.warning("%s: cutting off a torn last line of %d bytes (a crash mid-write; its answer was never sent)",
                    path, len(data) - whole)
        with open(path, "r+b") as file:
            file.truncate(whole)
            file.flush()
            os.fsync(file.fileno())
    return replay(path)


def _check_ours(path: Path, st: os.stat_result) -> None:
    """The journal holds the lease key and decides which units are done: only a file of ours, mode
    0600, with no other name (a second name would let a second dispatcher lock another lock file)."""
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"the journal {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise DataError(f"the journal {path} belongs to uid {st.st_uid}, not to you: another user could have "
                      f"written it; not trusted (remove it)")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise DataError(f"the journal {path} has mode {stat.S_IMODE(st.st_mode):04o}: others could have written or "
                      f"read it (it holds the lease key); not trusted (chmod 600 it, if it is yours)")
    if st.st_nlink > 1:
        raise DataError(f"the journal {path} has {st.st_nlink} names (hard links): a dispatcher opening it by another "
                      f"name would not see this one's lock; remove the other names")


class JournalWriteError(ResourceError):
    """The journal cannot be written (a full disk, an I/O error): the dispatcher cannot promise what it
    answers, so it stops, saying so; started again with the same --journal it loses nothing."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot write the journal {path}: {cause.strerror or cause}; the dispatcher "
                                      f"stops (free the space and start it again with the same --journal: nothing "
                                      f"is lost)")

    def __str__(self) -> str:
        return str(self.strerror)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable
    finally:
        os.close(fd)


def replay(path: Path) -> Replayed:
    """The state the journal's whole lines give; what follows the last newline (a write under way,
    or torn by a crash) is not read. A whole line that is not an event is damage: refused."""
    data = path.read_bytes()
    lines = data[: data.rfind(b"\n") + 1].decode(errors="replace").splitlines()
    if not lines:
        raise DataError(f"{path}: an empty journal")
    events = []
    for number, line in enumerate(lines, 1):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            raise DataError(f"{path}:{number}: not a journal line (the journal is damaged; remove it to start the "
                             f"job from its beginning)")
        events.append(event)
    if "job" not in events[0]:
        raise DataError(f"{path}: does not start with its job")
    state = Replayed(job=events[0]["job"], lease_key=bytes.fromhex(events[0].get("lease_key", "")))
    for number, event in enumerate(events[1:], 2):
        try:
            _apply(state, event)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DataError(f"{path}:{number}: not a journal line (the journal is damaged; remove it to start the "
                             f"job from its beginning)") from None
    return state


def _apply(state: Replayed, event: dict) -> None:
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
