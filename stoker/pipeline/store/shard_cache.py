"""A host's cache of remote shards: fetched once, checked, mapped by every worker process, kept under a limit.

An object store has no memory map, so a remote shard is fetched into `$STOKER_SHARD_CACHE`
(default ~/.cache/stoker/shards) and mapped from there: every worker process of the host shares
the copy and the zero-copy decode path stays what it is for local shards. A copy is named by the
URI and the sha256 the manifest gives the shard, so a shard replaced in a new manifest is fetched
anew.

- Checked where the bytes enter the host: each chunk is hashed as it is written, so a fetch costs
  no second read; a copy whose sha256 is not the manifest's is fetched once more, and a second
  mismatch refuses the shard (pipeline.store.integrity.ShardRefused). A copy already in the cache is
  checked at its first open on the host (pipeline.store.integrity: once per host, again when written
  since); a damaged one is removed and fetched again under the same rule.
- One fetch per host: a process fetches a shard holding an exclusive flock on the shard's lock
  file, and a process that wants the same shard meanwhile waits for that copy.
- In use is never evicted: a process holds a shared flock on the shard's lock file for as long
  as it has the copy open, and eviction removes only copies whose lock it can take exclusively.
- A size limit (`CacheConfig.limit_bytes`: `--shard-cache-gb`, or `$STOKER_SHARD_CACHE_GB`):
  before a fetch, copies are removed least recently used first (recency: the access time,
  set on every open) until the shard fits; the fetch's partial file is made its full size at
  once, so every process counts fetches in flight. Reserving, evicting and renaming a partial
  file into a copy all happen under one lock (`.locks/.evict`), so a count of the cache never
  sees a shard twice. Copies open in some process are not removed,
  so the cache can exceed the limit by what the processes have open.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from stoker.pipeline.store.integrity import Markers, ShardRefused, mismatch
from stoker.pipeline.store.locks import HeldLock, acquire
from stoker.pipeline.store.storage import StorageError, copy_hashed, file_size
from stoker.protos.errors import ConfigError

log = logging.getLogger("stoker.shards")

FOLDER_ENV = "STOKER_SHARD_CACHE"
LIMIT_ENV = "STOKER_SHARD_CACHE_GB"
FETCH_ATTEMPTS = 2  # a mismatch is fetched once more, then the shard is refused
OPEN_ATTEMPTS = 5  # a copy evicted between its fetch and its open (a tiny limit, busy host) is fetched again


MAX_GB = 1e6  # a petabyte: past any disk, and far from where GB -> bytes overflows


def parse_gb(text: str, what: str = LIMIT_ENV) -> float:
    """A cache limit in GB: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_GB:
        raise ConfigError(f"{what}: must be a number > 0 (GB) and at most {MAX_GB:g}, not {text!r}")
    return value


@dataclass(frozen=True)
class CacheConfig:
    """Where a host keeps its copies of remote shards, and how many bytes they may take."""

    folder: Path
    limit_bytes: int | None = None  # None: no limit (every shard a host reads stays)

    @classmethod
    def from_env(cls, limit_gb: float | None = None) -> CacheConfig:
        """The folder from $STOKER_SHARD_CACHE; the limit from `limit_gb` (--shard-cache-gb), else
        $STOKER_SHARD_CACHE_GB, else none."""
        folder = Path(os.environ.get(FOLDER_ENV) or Path.home() / ".cache" / "stoker" / "shards")
        if limit_gb is None and os.environ.get(LIMIT_ENV):
            limit_gb = parse_gb(os.environ[LIMIT_ENV])
        return cls(folder, None if limit_gb is None else int(limit_gb * (1 << 30)))


def cache_name(uri: str, sha256: str) -> str:
    """The copy's file name: unique to (uri, sha256), so a changed shard is a new copy, and
    ending in the shard's own name for whoever reads the folder."""
    return hashlib.sha256(f"{uri}\n{sha256}".encode()).hexdigest()[:24] + "-" + uri.rsplit("/", 1)[-1]


@dataclass
class CachedShard:
    """A cached copy this process has open: the shared lock keeps it from eviction until released."""

    path: Path
    lock: HeldLock

    def release(self) -> None:
        """Let the copy be evicted again (once no other process holds it)."""
        self.lock.release()


class ShardCache:
    """The cache as one process sees it; `events` counts what it did (fetched, fetch_mismatch,
    damaged, evicted) for the process's metrics."""

    def __init__(self, cfg: CacheConfig) -> None:
        self.cfg = cfg
        self.folder = cfg.folder
        self.locks = cfg.folder / ".locks"
        self.partials = cfg.folder / ".partial"
        self.markers = Markers(cfg.folder / ".verified")
        self.events: Counter[str] = Counter()

    @classmethod
    def from_env(cls) -> ShardCache:
        """The cache $STOKER_SHARD_CACHE and $STOKER_SHARD_CACHE_GB describe."""
        return cls(CacheConfig.from_env())

    def open(self, uri: str, sha256: str = "", size: int = 0) -> CachedShard:
        """A checked local copy of the remote shard `uri`, held open until `release()`; `size`: its
        bytes, as the manifest says (asked of the store when 0). Raises ShardRefused when the bytes
        fetched twice are not `sha256`."""
        name = cache_name(uri, sha256)
        target = self.folder / name
        for _ in range(OPEN_ATTEMPTS):
            self.locks.mkdir(parents=True, exist_ok=True)
            held = acquire(self.locks / name, exclusive=False)
            assert held is not None
            if target.exists() and (not sha256 or self.markers.matched(target, sha256)):
                _touch(target)
                return CachedShard(target, held)
            held.release()
            with acquire(self.locks / name) as exclusive:
                assert exclusive is not None
                self._ensure(uri, target, sha256, size)
        raise StorageError(f"cannot keep {uri} in the shard cache {self.folder}: evicted as fast as it is fetched "
                           f"(raise --shard-cache-gb)")

    def _ensure(self, uri: str, target: Path, sha256: str, size: int) -> None:
        """Under the shard's exclusive lock: a checked copy at `target`, fetched if need be."""
        attempts = FETCH_ATTEMPTS
        if target.exists():
            digest = mismatch(target, sha256, self.markers)
            if digest is None:
                return
            log.warning("cached copy %s of %s is damaged (sha256 %s, the manifest says %s); fetching it again",
                        target, uri, digest[:12], sha256[:12])
            self.events["damaged"] += 1
            target.unlink(missing_ok=True)
            attempts = 1  # the fetch again is the one more try
        self._fetch(uri, target, sha256, size, attempts)

    def _fetch(self, uri: str, target: Path, sha256: str, size: int, attempts: int) -> None:
        size = size or file_size(uri)
        digest = ""
        for attempt in range(1, attempts + 1):
            partial = self._reserve(target.name, size)
            try:
                with open(partial, "r+b") as out:
                    digest, copied = copy_hashed(uri, out)
                    out.truncate(copied)
                if not sha256 or digest == sha256:
                    with acquire(self.locks / ".evict"):  # a partial becomes a copy where no listing is under way
                        os.replace(partial, target)
                        self._make_room(0, keep=target.name)  # a shard larger than its manifest said
                    if sha256:
                        self.markers.mark(target, sha256)
                    _touch(target)
                    self.events["fetched"] += 1
                    return
            finally:
                partial.unlink(missing_ok=True)
            self.events["fetch_mismatch"] += 1
            log.warning("fetched %s: sha256 %s, the manifest says %s (attempt %d of %d)", uri, digest[:12],
                        sha256[:12], attempt, attempts)
        raise ShardRefused("sha256", f"shard {uri.rsplit('/', 1)[-1]}: fetched bytes have sha256 {digest[:12]}, the "
                                     f"manifest says {sha256[:12]} (changed in the store, or damaged on the way)")

    def _reserve(self, name: str, size: int) -> Path:
        """Room for `size` bytes, and the partial file that takes them, made at full size at once so that
        every process counts the fetch while it fills."""
        self.partials.mkdir(parents=True, exist_ok=True)
        with acquire(self.locks / ".evict"):
            self._make_room(size, keep=name)
            partial = self.partials / name
            with open(partial, "wb") as out:
                if size and self.cfg.limit_bytes is not None:
                    os.posix_fallocate(out.fileno(), 0, size)
        return partial

    def usage(self) -> int:
        """Bytes in the cache: copies and fetches in flight, read under the eviction lock (shared), under
        which every change of those sets is made. Its two listings are not one snapshot: without the lock,
        a fetch's partial file renamed into a copy between them, or a copy evicted and a fetch reserved,
        is counted twice (the cause of a test that saw three shards in a cache of two, and of evictions
        of copies that fitted). Not for use under that lock: flock would wait on itself."""
        if not self.folder.is_dir():
            return 0
        self.locks.mkdir(parents=True, exist_ok=True)
        with acquire(self.locks / ".evict", exclusive=False):
            return sum(size for _, size, _ in self._copies()) + sum(size for _, size in self._partials())

    def _copies(self) -> list[tuple[int, int, Path]]:
        """(access time ns, bytes, path) of every cached copy."""
        found = []
        for path in self.folder.iterdir() if self.folder.is_dir() else ():
            if path.name.startswith("."):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append((st.st_atime_ns, st.st_size, path))
        return found

    def _partials(self) -> list[tuple[Path, int]]:
        found = []
        for path in self.partials.iterdir() if self.partials.is_dir() else ():
            try:
                found.append((path, path.stat().st_size))
            except FileNotFoundError:
                continue
        return found

    def _make_room(self, incoming: int, keep: str) -> None:
        """Remove copies, least recently used first, until `incoming` more bytes fit under the limit;
        never one a process has open, nor `keep` (the shard being fetched). Also removes partial files
        of fetches that died (their lock is free)."""
        partial_bytes = 0
        for path, size in self._partials():
            stale = path.name != keep and acquire(self.locks / path.name, wait=False)
            if stale:
                path.unlink(missing_ok=True)
                stale.release(remove=True)
            else:
                partial_bytes += size
        limit = self.cfg.limit_bytes
        if limit is None:
            return
        copies = sorted(self._copies())
        total = partial_bytes + sum(size for _, size, _ in copies)
        for _, size, path in copies:
            if total + incoming <= limit:
                return
            if path.name == keep:
                continue
            lock = acquire(self.locks / path.name, wait=False)
            if lock is None:
                continue  # open in a process of this host
            self.markers.forget(path)
            path.unlink(missing_ok=True)
            lock.release(remove=True)
            total -= size
            self.events["evicted"] += 1
            log.info("evicted %s from the shard cache (%d MB in use of %d MB)", path.name, total >> 20, limit >> 20)
        if total + incoming > limit:
            log.warning("the shard cache %s holds %d MB in shards open on this host; %d MB more goes over its "
                        "limit of %d MB", self.folder, total >> 20, incoming >> 20, limit >> 20)


def _touch(path: Path) -> None:
    """Mark a copy used now (its access time; the mtime stays, so its check marker stays valid)."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass
