"""When each peer was last heard: the one table the control plane keeps of "last seen" times.

Pure state, no clock of its own: every call that needs the time is given `now`. A table with a
`limit` keeps at most that many keys, forgetting the one heard longest ago (a flood of made-up
names cannot grow it); one without keeps its keys in the order they were first heard.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LastHeard(Generic[K]):
    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._at: OrderedDict[K, float] = OrderedDict()  # key -> when last heard

    def record(self, key: K, now: float) -> K | None:
        """`key` is heard at `now`; returns the key forgotten to stay within `limit`, if one was."""
        self._at[key] = now
        if self.limit is None:  # kept in the order first heard
            return None
        self._at.move_to_end(key)
        return self._at.popitem(last=False)[0] if len(self._at) > self.limit else None

    def setdefault(self, key: K, now: float) -> None:
        """`key` is heard at `now` unless it is heard already."""
        if key not in self._at:
            self.record(key, now)

    def at(self, key: K) -> float | None:
        """When `key` was last heard (None: never, or forgotten)."""
        return self._at.get(key)

    def age(self, key: K, now: float) -> float | None:
        """Seconds since `key` was last heard (None: never, or forgotten)."""
        at = self._at.get(key)
        return None if at is None else now - at

    def silent_for(self, seconds: float, now: float, at_least: bool = False) -> list[K]:
        """The keys not heard for more than `seconds` (`at_least`: for `seconds` or more), in the table's order."""
        return [key for key, at in self._at.items() if (now - at >= seconds if at_least else now - at > seconds)]

    def heard_within(self, seconds: float, now: float) -> list[K]:
        """The keys heard `seconds` ago or later."""
        return [key for key, at in self._at.items() if now - at <= seconds]

    def forget(self, key: K) -> float | None:
        """Forget `key`; returns when it was last heard (None: it was not known)."""
        return self._at.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._at))

    def __len__(self) -> int:
        return len(self._at)
