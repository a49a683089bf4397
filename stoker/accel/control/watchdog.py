"""The stall watchdog: a rank that waits for its next batch is told who holds what it waits for.

Every rank says, with each heartbeat, how long it has waited for its next batch (Ack.waiting_s;
rank 0 beside its dispatcher says it directly), and every worker daemon says what each of its
processes is doing (Heartbeat.activity, read from stoker.pipeline.activity's slots). Once a rank has
waited `report_s`, the dispatcher names, in one line, the units of that rank's stream that are
leased and what their processes do (transforming sample S for N s, sending, reading, waiting
for credit), or that its next unit is pending with nobody to lease it. The line goes to the
log (again every `report_s` while the wait lasts), to a metric, and to every rank with the job's
figures; after `fail_s` (0: never) the job fails with it, as it does when a worker refuses it.

A rank waits for its next batch only when nothing of its stream has arrived: while the training
step runs, batches pile up to the credit window and none is waited for. So the bound measures
the data path, not a slow step or an evaluation pass. A rank none of whose units are pending or
leased waits for the other ranks (an epoch's end), and that wait is reported but never fails
the job. The dispatcher counts a wait from its own start at the earliest: a dispatcher that
restarted does not fail a job for the time it was away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.lease_table import Lease
from stoker.accel.control.serving.last_heard import LastHeard
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError

HOLDERS_NAMED = 3  # processes named in a line; the metric has them all
MAX_HOSTS = 65536  # hosts whose processes' activity is kept: heartbeats under made-up host ids cannot grow it
STALE_S = 30.0  # a rank or process not heard from this long is left out (the rank is dead: another line says so)


@dataclass(frozen=True)
class StallBounds:
    report_s: float = 60.0  # a rank that waited this long for a batch: say who holds what
    fail_s: float = 300.0  # ... this long: the job fails with that line (0: wait for ever)

    def __post_init__(self) -> None:
        if not self.report_s > 0 or self.fail_s < 0:
            raise ConfigError(f"stall bounds must be positive (report {self.report_s}, timeout {self.fail_s})")
        if self.fail_s and self.report_s >= self.fail_s:
            raise ConfigError(f"the stall report bound ({self.report_s:g} s) must be below the stall timeout "
                             f"({self.fail_s:g} s): the job would fail before anyone was told why")


@dataclass(frozen=True)
class Holder:
    """A process that holds a unit a waiting rank needs, and what it does."""

    rank: int
    unit_id: int
    host_id: str
    worker_id: str
    phase: str  # pipeline.activity.PHASES, or "unknown" before its daemon said
    sample_id: int
    for_s: float
    working_on: int = -1  # the unit its phase is about (it may hold units of several ranks)

    def describe(self) -> str:
        doing = self.phase
        if self.phase in ("reading", "transforming") and self.sample_id >= 0:
            doing += f" sample {self.sample_id}"
        if self.phase in ("reading", "transforming", "sending") and self.working_on not in (-1, self.unit_id):
            doing += f" of unit {self.working_on}"
        return f"unit {self.unit_id} is held by {self.worker_id}, {doing} for {self.for_s:.0f} s"


@dataclass(frozen=True)
class Stall:
    rank: int
    waited_s: float
    holders: tuple[Holder, ...]
    line: str
    has_work: bool  # units of the rank are pending or leased: a data stall, not a wait for the other ranks


@dataclass
class Watchdog:
    bounds: StallBounds = field(default_factory=StallBounds)
    clock: Callable[[], float] = field(default=lambda: 0.0)
    _started: float = field(init=False)
    _hosts: dict[str, dict[str, pb.ProcessActivity]] = field(init=False, default_factory=dict)  # host -> worker
    # id -> what that process does, as its daemon's last heartbeat said
    _host_heard: LastHeard[str] = field(init=False, default_factory=LastHeard)  # host -> when its daemon said it
    _waiting: dict[int, float] = field(init=False, default_factory=dict)  # rank -> since when it waits
    _rank_heard: LastHeard[int] = field(init=False, default_factory=LastHeard)  # rank -> when it said so

    def __post_init__(self) -> None:
        self._started = self.clock()

    def heard_host(self, host_id: str, activity: Iterable[pb.ProcessActivity]) -> None:
        """A daemon's heartbeat: what its processes do now (its processes not named are gone)."""
        if host_id in self._hosts or len(self._hosts) < MAX_HOSTS:
            self._hosts[host_id] = {item.worker_id: item for item in activity}
            self._host_heard.record(host_id, self.clock())

    def rank_waiting(self, rank: int, waiting_s: float) -> None:
        """A rank's heartbeat: it has waited `waiting_s` for its next batch (0: it is not waiting)."""
        now = self.clock()
        if waiting_s <= 0:
            self._waiting.pop(rank, None)
            self._rank_heard.forget(rank)
        else:
            self._waiting[rank] = max(now - waiting_s, self._started)
            self._rank_heard.record(rank, now)

    def waited(self) -> dict[int, float]:
        """Rank -> seconds it has waited for its next batch, for the ranks heard from lately."""
        now = self.clock()
        return {rank: now - since for rank, since in self._waiting.items()
                if (self._rank_heard.age(rank, now) or 0.0) < STALE_S}

    def check(self, dispatcher: Dispatcher) -> Stall | None:
        """The longest wait past `report_s`, with who holds what that rank needs; None when none."""
        waits = [(seconds, rank) for rank, seconds in self.waited().items() if seconds >= self.bounds.report_s]
        if not waits:
            return None
        waited_s, rank = max(waits)
        holders = tuple(self.holder(lease) for lease in dispatcher.leases.of_rank(rank))
        pending, first = dispatcher.queue.open_of_rank(rank)
        line = f"rank {rank} has waited {waited_s:.0f} s for its next batch"
        if holders:
            line += ": " + "; ".join(h.describe() for h in holders[:HOLDERS_NAMED])
            if len(holders) > HOLDERS_NAMED:
                line += f"; {len(holders) - HOLDERS_NAMED} more units leased"
            if pending:
                line += f"; {pending} more pending"
        elif first is not None:
            hosts = len(dispatcher.liveness.live_hosts())
            line += (f": its next unit {first.unit_id} is pending and no worker process has leased it "
                     f"({hosts} worker host{'s' if hosts != 1 else ''} alive{self._stuck_text()})")
        else:
            line += ": none of its units is pending or leased (it waits for the other ranks)"
        return Stall(rank, waited_s, holders, line, has_work=bool(holders) or first is not None)

    def _stuck_text(self) -> str:
        """The processes that sit in one sample's transform longer than the report bound: with every unit
        pending and nobody leasing, they are why (a transform stuck where no time limit reaches it)."""
        now, stuck = self.clock(), []
        for host_id, processes in self._hosts.items():
            age = self._host_heard.age(host_id, now) or 0.0
            if age > STALE_S:
                continue
            for worker_id, a in processes.items():
                if a.phase == "transforming" and a.for_s + age >= self.bounds.report_s:
                    stuck.append(Holder(-1, a.unit_id, host_id, worker_id, a.phase, a.sample_id, a.for_s + age,
                                        a.unit_id))
        if not stuck:
            return ""
        named = "; ".join(f"{h.worker_id} transforming sample {h.sample_id} of unit {h.unit_id} for {h.for_s:.0f} s"
                          for h in sorted(stuck, key=lambda h: -h.for_s)[:HOLDERS_NAMED])
        return f"; stuck: {named}" + (f" and {len(stuck) - HOLDERS_NAMED} more" if len(stuck) > HOLDERS_NAMED else "")

    def holder(self, lease: Lease) -> Holder:
        """Who holds `lease` and what it does now, as its daemon last said."""
        return self._holder(lease.unit.rank, lease.unit.unit_id, lease.host_id, lease.worker_id)

    def _holder(self, rank: int, unit_id: int, host_id: str, worker_id: str) -> Holder:
        processes, age = self._hosts.get(host_id), self._host_heard.age(host_id, self.clock())
        a = processes.get(worker_id) if processes is not None and age is not None and age <= STALE_S else None
        if a is None or age is None:
            return Holder(rank, unit_id, host_id, worker_id, "unknown", -1, 0.0)
        return Holder(rank, unit_id, host_id, worker_id, a.phase, a.sample_id, a.for_s + age, a.unit_id)
