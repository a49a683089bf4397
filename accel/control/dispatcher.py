"""The dispatcher: owns the epoch plan, leases work units, takes acks, re-leases lost work.

Pure state, no sockets: `control_server` maps control messages onto these methods, and the
consumer calls `ack` directly when it runs in the same process. It holds what the open epochs
need, not the whole job: the units of the epoch being leased and of the next (made from the
plan a few with each lease, so no lease waits for a whole epoch to be made), and done units
as one number for every whole epoch done plus the ids of the open epochs, so its memory does
not grow with the epoch number (ImageNet-1k for 90 epochs is 450,450 units). When an epoch is
done the journal is compacted to a snapshot. Units are handed out position by position
across the data-parallel ranks (`EpochPlan.lease_order`), each only once its rank has
attached (a unit's batches go to its rank's data socket). The dispatcher also keeps what every
rank's stream has given so far, in batches per unit, so that it can say how many steps an
epoch has on every rank and where every rank stands after a step.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from stoker.accel.control.journal import Journal
from stoker.pipeline.plan import EpochPlan, Unit
from stoker.protos.errors import StokerError
from stoker.protos.leases import HANDED_BACK, SHORT_UNIT, TRADED

SCAN_PAST = 64  # pending units a lease may pass over (ranks the asking process holds) before it says wait
AVOID_S = 5.0  # a unit redone because its leaseholder ended it short goes to another host first, this long
POISON_CRASHES = 2  # a sample whose transform killed this many processes is skipped from then on
CRASHES_KEPT = 4096  # samples whose crashes are counted at once: a flood of random crashes cannot grow it
MAKE_AHEAD_UNITS = 16  # units of the next epoch made per lease: ~0.1 ms, the epoch ready well before it is due


@dataclass
class Lease:
    unit: Unit
    host_id: str
    worker_id: str
    leased_at: float
    request_id: int = 0  # the worker's request that got it: a retry of that request gets this unit again
    key: str = ""  # the CURVE key it was leased to ("" without keys): only that key's retry gets it again


class RankError(StokerError, ValueError):
    """A consumer rank that cannot join the job as it asked."""


@dataclass
class DispatcherStats:
    pending: int
    leased: int
    done: int
    hosts_alive: int
    releases: int  # units taken from a lost host or a stale lease and leased again
    handed_back: int = 0  # units a worker process gave back, traded for an earlier one or unsendable (nothing lost)
    failure: str = ""  # why the job failed (a worker refused it); "" while it goes on
    stall: str = ""  # which rank waits for a batch, and who holds what it waits for (accel.control.watchdog)


@dataclass
class Dispatcher:
    plan: EpochPlan
    host_timeout_s: float = 10.0
    lease_timeout_s: float = 600.0  # a lease older than this is handed out again even if its host lives
    clock: Callable[[], float] = time.monotonic
    on_release: Callable[[str, int], None] | None = None  # (reason, units) for metrics
    done_before: frozenset[int] = frozenset()  # units a previous run completed (resume)
    journal: Journal | None = None  # every lease/ack/release is made durable before it is answered
    planned_batches: Callable[[Unit], int | None] | None = None  # images: a unit's batches follow from its size
    _pending: list[tuple[int, int, int, int, Unit]] = field(init=False, default_factory=list)  # a heap in lease
    # order, (epoch, position, rank, id, unit), of the epochs loaded so far; may hold acked units
    _pending_ids: set[int] = field(init=False, default_factory=set)
    _loaded: int = field(init=False, default=0)  # epochs whose units have been put in the heap
    _making: Iterator[Unit] | None = field(init=False, default=None)  # epoch _loaded's units, part-way in
    _done_below: int = field(init=False, default=0)  # every unit id below this is done: whole epochs
    _done_whole: int = field(init=False, default=0)  # units of those epochs (a resumed epoch has fewer)
    _done_in_epoch: dict[int, int] = field(init=False, default_factory=dict)  # open epoch -> its done units
    _leased: dict[int, Lease] = field(init=False, default_factory=dict)
    _by_request: dict[tuple[str, int, str], int] = field(init=False, default_factory=dict)  # (worker, request,
    # key) -> the unit that request was given: a repeated request is answered without a scan of every lease
    _done: set[int] = field(init=False, default_factory=set)  # done units at or above _done_below
    _hosts: dict[str, float] = field(init=False, default_factory=dict)
    _releases: int = field(init=False, default=0)
    _handed_back: int = field(init=False, default=0)
    _avoid: dict[int, tuple[str, float]] = field(init=False, default_factory=dict)  # unit -> (host that ended it
    # short, until when another host gets it first)
    _endpoints: dict[int, str] = field(init=False, default_factory=dict)  # rank -> its data socket
    _ranks: dict[int, tuple[str, float]] = field(init=False, default_factory=dict)  # rank -> (consumer, last heard)
    _prefix: dict[tuple[int, int], tuple[int, int]] = field(init=False, default_factory=dict)  # (epoch, rank) ->
    # (units, batches) a resumed job starts from: those units' counts are not known one by one
    _batches: dict[int, int] = field(init=False, default_factory=dict)  # unit -> batches it gave (acked)
    _received: dict[int, Unit] = field(init=False, default_factory=dict)  # all batches at their rank, not yet acked
    _stream_batches: dict[int, dict[int, int]] = field(init=False, default_factory=dict)  # epoch -> rank -> batches
    _started: dict[int, str] = field(init=False, default_factory=dict)  # rank -> the consumer whose start position
    # was applied (rewind_rank): its re-attaches, after a reconnect, change nothing
    _crashes: dict[int, int] = field(init=False, default_factory=dict)  # sample id -> processes it killed
    _poison: dict[int, str] = field(init=False, default_factory=dict)  # sample id -> why it is skipped unread
    total_units: int = field(init=False)
    failure: str = field(init=False, default="")  # the first refusal: the job is over, not finished
    stall: str = field(init=False, default="")  # the stall watchdog's line while a rank waits (accel.control.server)

    def __post_init__(self) -> None:
        per_epoch = self.plan.units_per_epoch
        self.total_units = self.plan.total_units
        replayed = self.journal.replayed if self.journal else None
        self._done_below = replayed.done_below if replayed else 0
        self._done_whole = sum(self.plan.units_in(e) for e in range(self._done_below // per_epoch if per_epoch else 0))
        if replayed:
            self._batches.update(replayed.batches)
        for unit_id in set(self.done_before) | (replayed.done if replayed else set()):
            self._mark_done(unit_id)
        now = self.clock()
        for unit_id, (host, worker, request_id, key) in (replayed.leases if replayed else {}).items():
            unit = self.plan.unit(unit_id)  # leases from before a restart stay with their hosts for one host timeout
            if unit is not None and not self._is_done(unit_id):
                self._hold(Lease(unit, host, worker, now, request_id, key))
                self._hosts.setdefault(host, now)
        self._close_done_epochs()
        self._loaded = self._done_below // per_epoch if per_epoch else 0
        self._fill()

    def _is_done(self, unit_id: int) -> bool:
        return unit_id < self._done_below or unit_id in self._done

    def _mark_done(self, unit_id: int) -> None:
        if self.plan.unit(unit_id) is not None and not self._is_done(unit_id):
            self._done.add(unit_id)
            epoch = unit_id // self.plan.units_per_epoch
            self._done_in_epoch[epoch] = self._done_in_epoch.get(epoch, 0) + 1

    def _close_done_epochs(self) -> bool:
        """Fold every whole epoch done at the low end into `_done_below`; True when one was."""
        per_epoch, closed = self.plan.units_per_epoch, False
        while per_epoch and (self._done_in_epoch.get(self._done_below // per_epoch)
                             == self.plan.units_in(self._done_below // per_epoch)):
            epoch = self._done_below // per_epoch
            self._done.difference_update(range(self._done_below, self._done_below + per_epoch))
            self._done_whole += self.plan.units_in(epoch)
            del self._done_in_epoch[epoch]
            self._done_below += per_epoch
            for unit_id in [u for u in self._batches if u < self._done_below - per_epoch]:
                del self._batches[unit_id]  # the epoch before the open one is kept: positions may ask for it
            for old in [e for e in self._stream_batches if e < epoch]:
                del self._stream_batches[old]
            for key in [k for k in self._prefix if k[0] < epoch]:
                del self._prefix[key]
            closed = True
        return closed

    def _fill(self) -> bool:
        """Load epochs into the lease heap, in order, until it holds a unit of a loaded epoch (a
        released unit, or a unit of the epoch being made ahead, waits for its epoch's turn);
        False when no unit is left. An epoch whose units are all done, leased or received adds
        nothing, so the next is loaded."""
        while self._loaded < self.plan.epochs and (not self._pending or self._pending[0][0] >= self._loaded):
            self._load(None)
        return bool(self._pending)

    def _load(self, most: int | None) -> None:
        """Put up to `most` more units (all, for None) of epoch `_loaded` in the heap; once its
        last is in, the epoch is loaded."""
        if self._making is None:
            self._making = self.plan.units_stepwise(self._loaded)
        taken = 0
        for unit in itertools.islice(self._making, most):
            taken += 1
            if not (self._is_done(unit.unit_id) or unit.unit_id in self._leased or unit.unit_id in self._received
                    or unit.unit_id in self._pending_ids):
                self._requeue(unit)
        if most is None or taken < most:
            self._making, self._loaded = None, self._loaded + 1

    def _make_ahead(self) -> None:
        """A few units of the epoch after the one being leased, so that it is ready when leasing
        reaches it and no lease waits for a whole epoch to be made."""
        if self._loaded < self.plan.epochs and self._pending and self._loaded <= self._pending[0][0] + 1:
            self._load(MAKE_AHEAD_UNITS)

    # ---- hosts -------------------------------------------------------------------------
    def heartbeat(self, host_id: str) -> None:
        """Registration and heartbeats both mark a host alive."""
        self._hosts[host_id] = self.clock()

    def live_hosts(self) -> list[str]:
        return list(self._hosts)

    def expire_hosts(self) -> list[str]:
        """Declare hosts silent for longer than host_timeout_s dead; re-lease their units."""
        now = self.clock()
        dead = [h for h, seen in self._hosts.items() if now - seen > self.host_timeout_s]
        for host in dead:
            del self._hosts[host]
            self.release(host, None, "host_timeout")
        self._expire_leases(now)
        return dead

    def _expire_leases(self, now: float) -> None:
        """A live host whose process hangs must not hold a unit forever; redoing it is safe
        (the consumer drops whichever copy of a batch arrives second)."""
        stale = [lease for lease in self._leased.values() if now - lease.leased_at > self.lease_timeout_s]
        for lease in stale:
            self.release(lease.host_id, [lease.worker_id], "lease_expired")

    # ---- ranks -------------------------------------------------------------------------
    def attach_rank(self, rank: int, data_endpoint: str, consumer_id: str = "", world_size: int = 0) -> None:
        """A rank's data socket: its units can be leased from now on. A rank held by another live
        consumer (heard from within the host timeout), a rank outside the job or another world
        size is refused with the reason (RankError)."""
        size = self.plan.world_size
        if world_size and world_size != size:
            raise RankError(f"this job has world size {size}, not {world_size}")
        if not 0 <= rank < size:
            raise RankError(f"rank {rank} is outside the job's ranks 0..{size - 1}")
        now = self.clock()
        owner = self._ranks.get(rank)
        if owner and owner[0] != consumer_id and now - owner[1] <= self.host_timeout_s:
            raise RankError(f"rank {rank} is already taken by consumer {owner[0]!r}, heard from "
                            f"{now - owner[1]:.1f} s ago")
        if owner and owner[0] != consumer_id:  # a new consumer for the rank: what the old one held is gone
            for unit in [u for u in self._received.values() if u.rank == rank]:
                del self._received[unit.unit_id]
                self._requeue(unit)
        self._ranks[rank] = (consumer_id, now)
        if data_endpoint:
            self._endpoints[rank] = data_endpoint

    def rank_heard(self, rank: int, consumer_id: str) -> None:
        owner = self._ranks.get(rank)
        if owner and owner[0] == consumer_id:
            self._ranks[rank] = (consumer_id, self.clock())

    def silent_ranks(self) -> list[int]:
        """Attached ranks not heard from for longer than the host timeout."""
        now = self.clock()
        return [rank for rank, (_, seen) in sorted(self._ranks.items()) if now - seen > self.host_timeout_s]

    def resume_position(self, epoch: int, ranks: list[tuple[int, int]], step: int) -> None:
        """A job resumed at `step` of `epoch`: rank r had consumed its first ranks[r][0] units and
        ranks[r][1] batches after them (the counts of those units need not be known one by one)."""
        for rank, (units, batches) in enumerate(ranks):
            self._prefix[(epoch, rank)] = (units, step - batches)

    def rewind_rank(self, rank: int, consumer_id: str, epoch: int, step: int, units: int, batches: int) -> int:
        """A new consumer of `rank` starts at `step` of `epoch`, having consumed its stream's first
        `units` units of that epoch and `batches` batches after them (its checkpoint; (0, 0, 0, 0)
        without one). Whatever of that rank's stream is done here past that point was stepped by a
        consumer whose steps are lost (it crashed after its last checkpoint): it goes back to the
        queue, so the rank gets it again, in order. Applied once per consumer (a re-attach after a
        reconnect changes nothing). Returns the units put back. RankError when that would need the
        batch counts of text units of epochs this dispatcher no longer keeps."""
        if self._started.get(rank) == consumer_id:
            return 0
        per = self.plan.units_per_epoch
        if not per or epoch >= self.plan.epochs:
            self._started[rank] = consumer_id
            return 0
        if self._done_below > (epoch + 1) * per and self.planned_batches is None:
            raise RankError(f"rank {rank} starts in epoch {epoch}, but this dispatcher has finished epoch "
                            f"{self._done_below // per - 1} and no longer knows the batch counts of text units before "
                            f"it: start the dispatcher again without its journal to continue from the checkpoint")
        while self._done_below > epoch * per:  # unfold whole epochs done back into ids, to take some back
            closed = self._done_below // per - 1
            ids = [u.unit_id for u in self.plan.units(closed)]
            self._done_below -= per
            self._done_whole -= len(ids)
            self._done.update(ids)
            self._done_in_epoch[closed] = len(ids)
        undone = 0
        for e in sorted(k for k in self._done_in_epoch if k >= epoch):
            for unit in self.plan.rank_units(e, rank)[units if e == epoch else 0:]:
                if unit.unit_id not in self._done:
                    continue
                self._done.discard(unit.unit_id)
                self._done_in_epoch[e] -= 1
                self._batches.pop(unit.unit_id, None)
                undone += 1
            if not self._done_in_epoch[e]:
                del self._done_in_epoch[e]
        for e in [k for k in self._stream_batches if k >= epoch]:
            self._stream_batches[e].pop(rank, None)  # it reports its stream's batches again
        self._prefix[(epoch, rank)] = (units, step - batches)
        if undone:  # make the epochs again from `epoch` on: a unit neither done, leased, received nor pending
            self._loaded, self._making = epoch, None  # goes back in the heap (_load); the rest are skipped
            self._fill()
        self._started[rank] = consumer_id
        if undone and self.journal is not None:
            self.journal.compact(self.snapshot())  # the journal has no event that undoes an ack
        return undone

    def endpoint(self, rank: int) -> str | None:
        return self._endpoints.get(rank)

    def batches_of(self, unit: Unit) -> int | None:
        """How many batches a unit gives: from its size (images), or once it has been acked (text)."""
        if self.planned_batches is not None:
            return self.planned_batches(unit)
        return self._batches.get(unit.unit_id)

    def epoch_steps(self, epoch: int, rank: int, batches: int) -> int | None:
        """A rank has received its whole stream of `epoch` (`batches` batches); once every rank
        has, the epoch's steps on every rank: the longest stream."""
        reported = self._stream_batches.setdefault(epoch, {})
        reported[rank] = batches
        return max(reported.values()) if len(reported) == self.plan.world_size else None

    def position(self, epoch: int, step: int) -> list[tuple[int, int]]:
        """Per rank, where its stream stands after `step` steps of `epoch`: (units whose batches are
        all counted, batches consumed after them). A unit whose count is not known yet (its ack is
        on its way) is simply not counted: resuming then replays a few more batches, silently."""
        out = []
        for rank in range(self.plan.world_size):
            index, consumed = self._prefix.get((epoch, rank), (0, 0))
            if consumed > step:
                index, consumed = 0, 0
            for unit in self.plan.rank_units(epoch, rank)[index:]:
                count = self.batches_of(unit)
                if count is None or consumed + count > step:
                    break
                consumed += count
                index += 1
            out.append((index, step - consumed))
        return out

    # ---- units -------------------------------------------------------------------------
    def lease(self, host_id: str, worker_id: str, request_id: int = 0, key: str = "",
              holding: Iterable[int] = ()) -> Unit | None:
        """The next unit for this worker process, or None when it should wait.

        A process holds at most one lease per rank and sends their batches in step order, so a
        rank that waits, in lock-step, for another rank's batch never keeps the process from
        making that batch (workers.process). `holding`: the units the process still works on. It
        is given the earliest pending unit of a rank it holds none of; or, when a rank's earliest
        pending unit comes before the one the process holds of that rank (that unit was handed
        back after the process took the later one), that unit in exchange for the held one,
        which goes back to the queue (TRADED: nothing lost). So the unit the slowest rank needs
        next is never stuck behind leases of later units.

        A worker repeats a request whose answer it did not get. When the dispatcher died between
        journaling a lease and answering, the repeat reaches a restarted dispatcher that has no
        reply cache: it must get the same unit, or that unit would stay leased to a worker that
        never heard of it until the lease expired."""
        self._hosts[host_id] = self.clock()
        if request_id:
            again = self._by_request.get((worker_id, request_id, key))
            if again is not None and again in self._leased:
                return self._leased[again].unit
        held = {}  # rank -> the unit of it this process holds (one per rank: a longer list is not believed)
        for unit_id in itertools.islice(holding, self.plan.world_size):
            lease = self._leased.get(unit_id)
            if lease is not None and (lease.host_id, lease.worker_id, lease.key) == (host_id, worker_id, key):
                held[lease.unit.rank] = lease.unit
        unit = self._take(lambda unit: (unit.rank not in held or _lease_key(unit) < _lease_key(held[unit.rank]))
                          and not self._avoided(unit.unit_id, host_id))
        if unit is None:
            return None
        if unit.rank in held:
            self.release(host_id, [worker_id], TRADED, [held[unit.rank].unit_id], key)
        if self.journal:
            self.journal.lease(unit.unit_id, host_id, worker_id, request_id, key)
        self._hold(Lease(unit, host_id, worker_id, self.clock(), request_id, key))
        self._make_ahead()
        return unit

    def redo(self, unit_id: int) -> bool:
        """The unit's rank got a last batch from its leaseholder that left samples of it out: lease it
        again, to another host when one asks within AVOID_S (SHORT_UNIT). True if it was leased."""
        lease = self._leased.get(unit_id)
        if lease is None or self._is_done(unit_id):
            return False
        self._avoid[unit_id] = (lease.host_id, self.clock() + AVOID_S)
        return self.release(lease.host_id, [lease.worker_id], SHORT_UNIT, [unit_id]) > 0

    def _avoided(self, unit_id: int, host_id: str) -> bool:
        entry = self._avoid.get(unit_id)
        if entry is None or entry[0] != host_id:
            return False
        if self.clock() >= entry[1] or len(self._hosts) < 2:
            del self._avoid[unit_id]  # no other host took it in time (or there is none): anyone may
            return False
        return True

    def _take(self, wanted: Callable[[Unit], bool]) -> Unit | None:
        """Pop the earliest pending unit of an attached rank that `wanted` accepts; the units passed
        over keep their places. The scan stops after a bounded number of them: each rank's first
        pending unit lies within a few positions of the front (units are leased position by
        position), so a longer scan would only find units of ranks far ahead of the others."""
        passed: list[tuple[int, int, int, int, Unit]] = []
        limit = SCAN_PAST + 2 * self.plan.world_size
        try:
            while self._fill() and len(passed) <= limit:
                entry = heapq.heappop(self._pending)
                unit = entry[-1]
                if self._is_done(unit.unit_id):
                    self._pending_ids.discard(unit.unit_id)
                    continue
                if unit.rank not in self._endpoints or not wanted(unit):
                    passed.append(entry)
                    continue
                self._pending_ids.discard(unit.unit_id)
                return unit
            return None
        finally:
            for entry in passed:
                heapq.heappush(self._pending, entry)

    def received(self, unit_id: int) -> None:
        """Every batch of the unit is at its rank: its lease is over, and no lost host makes it redone."""
        lease = self._let_go(unit_id)
        if lease is not None and not self._is_done(unit_id):
            self._received[unit_id] = lease.unit

    def ack(self, unit_id: int, batches: int | None = None) -> bool:
        """The consumer has stepped every batch of the unit (`batches` of them); True the first time."""
        if self.plan.unit(unit_id) is None or self._is_done(unit_id):
            return False
        if batches is not None:
            self._batches[unit_id] = batches
        if self.journal:
            self.journal.ack(unit_id, batches)
        self._mark_done(unit_id)
        self._let_go(unit_id)
        self._received.pop(unit_id, None)
        self._pending_ids.discard(unit_id)
        if self._close_done_epochs() and self.journal:
            self.journal.compact(self.snapshot())
        return True

    def snapshot(self) -> dict:
        """What a restart needs, in place of the history that led to it (journal compaction)."""
        return {"done_below": self._done_below, "done": sorted(self._done),
                "batches": {str(u): b for u, b in self._batches.items()},
                "leases": [[lease.unit.unit_id, lease.host_id, lease.worker_id, lease.request_id, lease.key]
                           for lease in self._leased.values()]}

    def release(self, host_id: str, worker_ids: Iterable[str] | None, reason: str,
                unit_ids: Iterable[int] | None = None, key: str | None = None) -> int:
        """Put a host's (or some of its workers') unacked units back in the queue, at their place in the
        lease order: the earliest unit is always the next one handed out. `key`: only the leases made
        to that CURVE key (a worker's release; with keys nobody gives back another key's units)."""
        wanted = set(worker_ids) if worker_ids else None
        units = set(unit_ids) if unit_ids else None
        lost = [lease for lease in self._leased.values()
                if lease.host_id == host_id and (wanted is None or lease.worker_id in wanted)
                and (units is None or lease.unit.unit_id in units) and (key is None or lease.key == key)]
        if lost and self.journal:
            self.journal.release([lease.unit.unit_id for lease in lost])
        for lease in sorted(lost, key=lambda item: item.leased_at, reverse=True):
            self._let_go(lease.unit.unit_id)
            self._requeue(lease.unit)
        if lost and reason in HANDED_BACK:
            self._handed_back += len(lost)
        elif lost:
            self._releases += len(lost)
        if lost:
            if self.on_release:
                self.on_release(reason, len(lost))
        return len(lost)

    # ---- samples that kill their process ----------------------------------------------------
    def sample_crashed(self, sample_id: int, how: str) -> bool:
        """A worker process died transforming `sample_id` (`how`: its host, process and exit). The
        second such death makes the sample poison: every lease of its unit skips it from then on
        (one death may be bad luck, an OOM kill elsewhere; two are the sample). True then."""
        if sample_id in self._poison:
            return False
        count = self._crashes.get(sample_id, 0) + 1
        if count < POISON_CRASHES:
            if len(self._crashes) >= CRASHES_KEPT:
                self._crashes.pop(next(iter(self._crashes)))
            self._crashes[sample_id] = count
            return False
        self._crashes.pop(sample_id, None)
        self._poison[sample_id] = f"the transform killed {POISON_CRASHES} worker processes on it (last: {how})"
        return True

    def skips_of(self, sample_id: int) -> str:
        """Why a poison sample is skipped ("" for one that is not)."""
        return self._poison.get(sample_id, "")

    def skips_for(self, unit: Unit) -> dict[int, str]:
        """The unit's poison samples, and why each is skipped."""
        return {sample_id: why for sample_id, why in self._poison.items()
                if any(g.first_sample_id + g.start <= sample_id < g.first_sample_id + g.stop for g in unit.segments)}

    # ---- what holds a rank's stream (the stall watchdog's question) ----------------------------
    def leases_of_rank(self, rank: int) -> list[Lease]:
        """The units of `rank` leased now, in its stream's order."""
        return sorted((lease for lease in self._leased.values() if lease.unit.rank == rank),
                      key=lambda lease: _lease_key(lease.unit))

    def open_units_of_rank(self, rank: int) -> tuple[int, Unit | None]:
        """How many of `rank`'s units in the loaded epochs are pending (neither leased nor done), and
        its earliest pending one."""
        pending = {item[3]: item for item in self._pending if item[4].rank == rank and item[3] in self._pending_ids
                   and item[3] not in self._leased and not self._is_done(item[3])}  # the heap may hold one twice
        first = min(pending.values(), key=lambda item: item[:4], default=None)
        return len(pending), first[4] if first else None

    def _hold(self, lease: Lease) -> None:
        self._leased[lease.unit.unit_id] = lease
        self._avoid.pop(lease.unit.unit_id, None)
        if lease.request_id:
            self._by_request[(lease.worker_id, lease.request_id, lease.key)] = lease.unit.unit_id

    def _let_go(self, unit_id: int) -> Lease | None:
        lease = self._leased.pop(unit_id, None)
        if lease is not None and lease.request_id:
            self._by_request.pop((lease.worker_id, lease.request_id, lease.key), None)
        return lease

    def _requeue(self, unit: Unit) -> None:
        heapq.heappush(self._pending, (*_lease_key(unit), unit.unit_id, unit))
        self._pending_ids.add(unit.unit_id)

    def done_units(self) -> list[int]:
        return [u.unit_id for e in range(self._done_below // self.plan.units_per_epoch) for u in self.plan.units(e)] \
            + sorted(self._done) if self.plan.units_per_epoch else []

    @property
    def finished(self) -> bool:
        return self._done_whole + len(self._done) == self.total_units

    def fail(self, reason: str) -> bool:
        """A worker refused the job (it cannot run it as pinned): the job is over. True the first time."""
        if self.failure or self.finished:
            return False
        self.failure = reason
        return True

    @property
    def over(self) -> bool:
        """Nothing more will be leased: every unit is done, or the job failed."""
        return self.finished or bool(self.failure)

    def stats(self) -> DispatcherStats:
        done = self._done_whole + len(self._done)
        in_flight = len(self._leased) + len(self._received)
        return DispatcherStats(self.total_units - done - in_flight, in_flight, done, len(self._hosts), self._releases,
                               self._handed_back, self.failure, self.stall)


def _lease_key(unit: Unit) -> tuple[int, int, int]:
    """The order units are leased in: position by position across the ranks (EpochPlan.lease_order)."""
    return unit.epoch, unit.position, unit.rank
