"""A unit's samples a decode process (workers.process) skips unread, as its batching code reads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping


class Skips(Mapping[int, str]):
    """A unit's samples to skip unread, as the batching code reads them at each sample: the lease's list,
    then what this process knows is poison, refreshed (`refresh`, rate-limited) before each look, so a
    sample that became poison while the unit was in hand, even mid-batch, is not waited on again."""

    def __init__(self, known: Mapping[int, str], refresh: Callable[[], None]) -> None:
        self.known, self.refresh = known, refresh

    def __contains__(self, sample_id: object) -> bool:
        self.refresh()
        return sample_id in self.known

    def __getitem__(self, sample_id: int) -> str:
        return self.known[sample_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)
