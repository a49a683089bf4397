"""The image shards one worker process has open, for the units it holds.

Each shard is opened (and checked against the manifest: pipeline.store.shards) when a unit first needs
it, kept while any unit in hand uses it and for a few units after (IDLE_KEEP: the next unit may
use it too), then closed, so that a process keeps open only what its units need and the host's
shard cache can evict the rest. A shard that cannot be used is refused for the life of the
process: asked again, it answers with the same reason, so its samples are skipped, not retried
and not crashed on.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from stoker.pipeline.store.integrity import ShardRefused
from stoker.pipeline.store.shard_cache import ShardCache
from stoker.pipeline.store.shards import Manifest, ShardReader

log = logging.getLogger("stoker.worker")

IDLE_KEEP = 2  # shards no unit in hand uses, kept open in case the next unit does


class OpenShards:
    """`events` counts what happened since `take_events()`: the cache's (fetched, fetch_mismatch,
    damaged, evicted) and `refused:<kind>` (sha256, rows, schema, unreadable), once per shard."""

    def __init__(self, manifest: Manifest, cache: ShardCache, idle_keep: int = IDLE_KEEP) -> None:
        self.manifest = manifest
        self.cache = cache
        self.idle_keep = idle_keep
        self.readers: dict[int, ShardReader] = {}
        self.refused: dict[int, str] = {}  # shard -> why its samples are skipped
        self._users: Counter[int] = Counter()  # shard -> units in hand that read it
        self._idle: OrderedDict[int, None] = OrderedDict()  # open, used by no unit in hand, oldest first
        self._events: Counter[str] = Counter()

    def reader(self, shard: int) -> ShardReader | str:
        """The shard's reader, or why it cannot be used."""
        if shard in self.refused:
            return self.refused[shard]
        if shard not in self.readers:
            try:
                self.readers[shard] = self.manifest.open_shard(shard, self.cache)
            except ShardRefused as exc:
                return self._refuse(shard, exc.kind, str(exc))
            except (OSError, ValueError) as exc:
                return self._refuse(shard, "unreadable", f"unreadable shard: {exc}")
            if not self._users[shard]:
                self._set_idle(shard)
        return self.readers[shard]

    def _refuse(self, shard: int, kind: str, reason: str) -> str:
        log.error("shard %s is unusable, its samples are skipped: %s", self.manifest.shard_uri(shard), reason)
        self.refused[shard] = reason
        self._events[f"refused:{kind}"] += 1
        return reason

    @contextmanager
    def holding(self, shards: Iterable[int]) -> Iterator[None]:
        """Keep the shards open while the block runs (a unit's batches are being made)."""
        held = sorted(set(shards))
        for shard in held:
            self._users[shard] += 1
            self._idle.pop(shard, None)
        try:
            yield
        finally:
            for shard in held:
                self._users[shard] -= 1
                if not self._users[shard]:
                    del self._users[shard]
                    if shard in self.readers:
                        self._set_idle(shard)

    def _set_idle(self, shard: int) -> None:
        self._idle[shard] = None
        self._idle.move_to_end(shard)
        while len(self._idle) > self.idle_keep:
            oldest, _ = self._idle.popitem(last=False)
            self.readers.pop(oldest).close()

    def take_events(self) -> Counter[str]:
        events = self._events + self.cache.events
        self._events.clear()
        self.cache.events.clear()
        return events

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()
        self._idle.clear()
