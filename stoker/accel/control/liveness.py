"""Who is alive: worker hosts by their last heartbeat, consumer ranks by their owner and last word.

Pure state on an injected clock: the dispatcher (accel.control.dispatcher) asks it who went
silent and which consumer may hold a rank; what follows (re-leasing a dead host's units) is
the dispatcher's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stoker.protos.errors import StokerError


class RankError(StokerError, ValueError):
    """A consumer rank that cannot join the job as it asked."""


@dataclass
class Liveness:
    world_size: int
    timeout_s: float  # silent longer than this is gone (hosts and ranks alike)
    clock: Callable[[], float]
    _hosts: dict[str, float] = field(default_factory=dict)  # host -> last heard
    _ranks: dict[int, tuple[str, float]] = field(default_factory=dict)  # rank -> (consumer, last heard)
    _endpoints: dict[int, str] = field(default_factory=dict)  # rank -> its data socket

    # ---- hosts ----------------------------------------------------------------------------
    def heartbeat(self, host_id: str) -> None:
        self._hosts[host_id] = self.clock()

    def known(self, host_id: str) -> None:
        """A host a restarted dispatcher's journal names: alive until it has been silent a timeout."""
        self._hosts.setdefault(host_id, self.clock())

    def live_hosts(self) -> list[str]:
        return list(self._hosts)

    def expired_hosts(self) -> list[str]:
        """Hosts silent for longer than the timeout, forgotten from now on."""
        now = self.clock()
        dead = [host for host, seen in self._hosts.items() if now - seen > self.timeout_s]
        for host in dead:
            del self._hosts[host]
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
        owner = self._ranks.get(rank)
        if owner and owner[0] != consumer_id and now - owner[1] <= self.timeout_s:
            raise RankError(f"rank {rank} is already taken by consumer {owner[0]!r}, heard from "
                            f"{now - owner[1]:.1f} s ago")
        self._ranks[rank] = (consumer_id, now)
        return owner is not None and owner[0] != consumer_id

    def set_endpoint(self, rank: int, data_endpoint: str) -> None:
        if data_endpoint:
            self._endpoints[rank] = data_endpoint

    def endpoint(self, rank: int) -> str | None:
        return self._endpoints.get(rank)

    def attached(self, rank: int) -> bool:
        """The rank's data socket is known: its units can be leased."""
        return rank in self._endpoints

    def rank_heard(self, rank: int, consumer_id: str) -> None:
        owner = self._ranks.get(rank)
        if owner and owner[0] == consumer_id:
            self._ranks[rank] = (consumer_id, self.clock())

    def silent_ranks(self) -> list[int]:
        """Attached ranks not heard from for longer than the timeout."""
        now = self.clock()
        return [rank for rank, (_, seen) in sorted(self._ranks.items()) if now - seen > self.timeout_s]
