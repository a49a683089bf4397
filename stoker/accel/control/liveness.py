"""Who is alive: worker hosts by their last heartbeat, consumer ranks by their owner and last word.

Pure state on an injected clock: the dispatcher (accel.control.dispatcher) asks it who went
silent and which consumer may hold a rank; what follows (re-leasing a dead host's units) is
the dispatcher's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stoker.accel.control.serving.last_heard import LastHeard
from stoker.protos.errors import PeerError


class RankError(PeerError, ValueError):  # a ValueError as it always was
    """A consumer rank that cannot join the job as it asked."""


@dataclass
class Liveness:
    world_size: int
    timeout_s: float  # silent longer than this is gone (hosts and ranks alike)
    clock: Callable[[], float]
    _hosts: LastHeard[str] = field(default_factory=LastHeard)  # host -> last heard
    _owners: dict[int, str] = field(default_factory=dict)  # rank -> the consumer that holds it
    _ranks: LastHeard[int] = field(default_factory=LastHeard)  # rank -> when its consumer was last heard
    _endpoints: dict[int, str] = field(default_factory=dict)  # rank -> its data socket

    # ---- hosts ----------------------------------------------------------------------------
    def heartbeat(self, host_id: str) -> None:
        self._hosts.record(host_id, self.clock())

    def known(self, host_id: str) -> None:
        """A host a restarted dispatcher's journal names: alive until it has been silent a timeout."""
        self._hosts.setdefault(host_id, self.clock())

    def live_hosts(self) -> list[str]:
        return list(self._hosts)

    def expired_hosts(self) -> list[str]:
        """Hosts silent for longer than the timeout, forgotten from now on."""
        now = self.clock()
        dead = self._hosts.silent_for(self.timeout_s, now)
        for host in dead:
            self._hosts.forget(host)
        return dead

    # ---- ranks ----------------------------------------------------------------------------
    def claim_rank(self, rank: int, consumer_id: str, world_size: int = 0) -> bool:
        """`consumer_id` takes `rank`; True when it replaces another consumer (whose batches in hand
        are lost). A rank held by another live consumer, a rank outside the job or another world
        size is refused with the reason (RankError)."""
        if world_size and world_size != self.world_size:
            raise RankError(f"this job has world size {self.world_size}, not {world_size}")
        if not 0 <= rank < self.world_size:
            raise RankError(f"rank {rank} is outside the job's ranks 0..{self.world_size - 1}")
        now = self.clock()
        owner, age = self._owners.get(rank), self._ranks.age(rank, now)
        if owner is not None and age is not None and owner != consumer_id and age <= self.timeout_s:
            raise RankError(f"rank {rank} is already taken by consumer {owner!r}, heard from {age:.1f} s ago")
        self._owners[rank] = consumer_id
        self._ranks.record(rank, now)
        return owner is not None and owner != consumer_id

    def set_endpoint(self, rank: int, data_endpoint: str) -> None:
        if data_endpoint:
            self._endpoints[rank] = data_endpoint

    def endpoint(self, rank: int) -> str | None:
        return self._endpoints.get(rank)

    def attached(self, rank: int) -> bool:
        """The rank's data socket is known: its units can be leased."""
        return rank in self._endpoints

    def rank_heard(self, rank: int, consumer_id: str) -> None:
        if self._owners.get(rank) == consumer_id:
            self._ranks.record(rank, self.clock())

    def silent_ranks(self) -> list[int]:
        """Attached ranks not heard from for longer than the timeout."""
        return sorted(self._ranks.silent_for(self.timeout_s, self.clock()))
