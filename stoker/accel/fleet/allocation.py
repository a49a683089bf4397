"""How a fleet's worker processes are shared between its jobs: weighted max-min fair, work-conserving,
damped. The first part of "one fleet for many jobs" (issue 36), as a pure object: no sockets, no
clock; the fleet service that will run it tells it each job's ask and the processes each holds,
and carries out the moves it returns.

A job asks for `want` processes: what its live demand says it can use now (a fed job, stalling
under its target with credit waiting, wants no more than it holds; a starving one, what its
calibrated rate says it needs). Its `min_cores` are given first, as far as the fleet holds them
(a guarantee: even beyond its want, and at other jobs' expense);
then processes go one at a time to the job whose share (processes over weight) is the smallest
among those still short of their cap (the smaller of `want` and `max_cores`): weighted max-min
fairness by progressive filling. Idle processes always go to a job that wants them (work-
conserving); a job is cut below what it holds only for another job below its fair share. Moves are
damped: idle processes are handed out first, then at most `max_moves` processes move a round,
from the job furthest above its target to the job furthest below it, so a change of asks never
makes the whole fleet change hands at once and the same asks never move a process back. A job
above its target while no job is below its own (a fed job whose need fell) gives one process a
round back to idle: the fleet's holdings meet its targets, so what it offers idle is what it has.

A job that has not measured its need yet (`takes_idle`) asks for a small start; beyond it, it is
given only the processes no other job wants, so a fed job never loses a process to a newcomer
beyond that start, and the fleet still leaves nothing idle that someone could use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stoker.accel.control.fleet_seat import MAX_WEIGHT, MIN_WEIGHT
from stoker.protos.errors import ConfigError


@dataclass(frozen=True)
class JobAsk:
    job_id: str
    want: int  # processes its live demand says it can use now
    weight: float = 1.0
    min_cores: int = 0
    max_cores: int | None = None
    takes_idle: bool = False  # not measured yet: beyond `want` (its start) it takes what no other job wants

    def __post_init__(self) -> None:
        """Refused at registration with one line (issue 36: invalid weights or limits)."""
        if not MIN_WEIGHT <= self.weight <= MAX_WEIGHT:  # NaN fails it too
            raise ConfigError(f"job {self.job_id}: weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, "
                              f"not {self.weight!r}")
        if self.min_cores < 0 or self.want < 0:
            raise ConfigError(f"job {self.job_id}: want and min cores cannot be negative")
        if self.max_cores is not None and self.max_cores < max(self.min_cores, 1):
            raise ConfigError(f"job {self.job_id}: max cores {self.max_cores} is below its min cores "
                              f"{self.min_cores} (or below 1)")

    @property
    def cap(self) -> int:
        """The most it may be given now."""
        return self.want if self.max_cores is None else min(self.want, self.max_cores)


@dataclass(frozen=True)
class Move:
    job_from: str | None  # None: an idle process
    job_to: str | None  # None: back to idle
    processes: int


@dataclass
class Allocation:
    targets: dict[str, int]  # job -> processes it should hold (what the fleet converges to)
    moves: list[Move] = field(default_factory=list)  # this round's, damped
    missing: dict[str, int] = field(default_factory=dict)  # job -> processes it wants beyond its target
    reasons: dict[str, str] = field(default_factory=dict)  # job -> why its target is what it is (logged)


def progressive_filling(capacity: int, asks: list[JobAsk]) -> dict[str, int]:
    """Each job's processes: its floor (min cores, cut by weight when the fleet holds too few), then
    progressive filling by the smallest weighted share among jobs short of their cap."""
    weights = {a.job_id: a.weight for a in asks}
    floors = _floors(capacity, asks)
    targets = dict(floors)
    left = _fill(capacity - sum(floors.values()), targets, {a.job_id: max(a.cap, targets[a.job_id]) for a in asks},
                 weights)
    idle_caps = {a.job_id: capacity if a.max_cores is None else max(a.max_cores, targets[a.job_id])
                 for a in asks if a.takes_idle}
    _fill(left, targets, idle_caps, weights)  # what no job wants goes to those not measured yet
    return targets


def _fill(left: int, counts: dict[str, int], caps: dict[str, int], weights: dict[str, float]) -> int:
    """Hand `left` processes out one at a time, each to the job (of `caps`) with the smallest share (count over
    weight; ties: the larger weight, then the id) still under its cap; returns what is left. The same result
    as that loop in O(jobs) per level instead of per process: every share below a level found by bisection
    is handed out at once (what a 1,000-host fleet needs to decide in milliseconds), the last few one by one."""
    room = {j: caps[j] - counts[j] for j in caps if counts[j] < caps[j]}
    if left <= 0 or not room:
        return left
    if sum(room.values()) <= left:
        for job, more in room.items():
            counts[job] += more
        return left - sum(room.values())
    low, high = 0.0, max(caps[j] / weights[j] for j in room)  # below `high`, more shares than processes left
    while True:
        mid = (low + high) / 2
        if mid in (low, high):
            break
        low, high = (mid, high) if sum(_shares_below(mid, counts[j], caps[j], weights[j]) for j in room) <= left \
            else (low, mid)
    for job in room:
        given = _shares_below(low, counts[job], caps[job], weights[job])
        counts[job] += given
        left -= given
    short = {j for j in room if counts[j] < caps[j]}
    while left > 0 and short:
        job = min(short, key=lambda j: (counts[j] / weights[j], -weights[j], j))
        counts[job] += 1
        left -= 1
        if counts[job] >= caps[job]:
            short.discard(job)
    return left


def _shares_below(level: float, count: int, cap: int, weight: float) -> int:
    """How many of a job's next processes (the k-th from `count` up to `cap`) it gets at a share k / weight
    under `level`: those the one-at-a-time loop hands it before any share of `level` or more."""
    k = min(max(count, math.ceil(level * weight)), cap)
    while k > count and (k - 1) / weight >= level:
        k -= 1
    while k < cap and k / weight < level:
        k += 1
    return k - count


def _floors(capacity: int, asks: list[JobAsk]) -> dict[str, int]:
    """Min cores (a guarantee, whatever the job measures it wants; capped at its max); when they do not
    all fit, shared by weight (max-min)."""
    wanted = {a.job_id: a.min_cores if a.max_cores is None else min(a.min_cores, a.max_cores) for a in asks}
    if sum(wanted.values()) <= capacity:
        return wanted
    floors = dict.fromkeys(wanted, 0)
    _fill(capacity, floors, wanted, {a.job_id: a.weight for a in asks})
    return floors


def allocate(capacity: int, asks: list[JobAsk], holding: dict[str, int], max_moves: int = 2) -> Allocation:
    """The targets for `asks` on a fleet of `capacity` processes, and this round's moves from what each
    job holds now (`holding`; a job not in it holds none). Idle processes are handed out first (they
    cost nobody anything), then at most `max_moves` processes change jobs."""
    if capacity < 0 or max_moves < 1:
        raise ConfigError(f"capacity {capacity} and max moves {max_moves}: capacity cannot be negative, and "
                          "at least one process must be allowed to move a round")
    ids = [a.job_id for a in asks]
    if len(set(ids)) != len(ids):
        raise ConfigError("a job is registered twice")
    targets = progressive_filling(capacity, asks)
    now = {job: holding.get(job, 0) for job in targets}
    moves = _idle_first(capacity - sum(holding.values()), targets, now)
    moves += _damped_transfers(targets, now, max_moves)
    moves += _surplus_back(targets, now)
    return Allocation(targets, moves, {a.job_id: max(0, a.cap - targets[a.job_id]) for a in asks},
                      {a.job_id: _reason(a, targets[a.job_id], capacity) for a in asks})


def _idle_first(idle: int, targets: dict[str, int], now: dict[str, int]) -> list[Move]:
    moves = []
    for job in sorted(targets, key=lambda j: now[j] - targets[j]):  # the furthest below first
        give = min(idle, targets[job] - now[job])
        if give > 0:
            moves.append(Move(None, job, give))
            now[job] += give
            idle -= give
    return moves


def _damped_transfers(targets: dict[str, int], now: dict[str, int], max_moves: int) -> list[Move]:
    moves: list[Move] = []
    budget = max_moves
    while budget > 0:
        over = max(targets, key=lambda j: (now[j] - targets[j], j), default=None)
        under = min(targets, key=lambda j: (now[j] - targets[j], j), default=None)
        if over is None or under is None or now[over] <= targets[over] or now[under] >= targets[under]:
            break
        moves.append(Move(over, under, 1))
        now[over] -= 1
        now[under] += 1
        budget -= 1
    return moves


def _surplus_back(targets: dict[str, int], now: dict[str, int]) -> list[Move]:
    """One process of the job furthest above its target back to idle, when no job is below its own."""
    if not targets or any(now[j] < targets[j] for j in targets):
        return []
    over = max(targets, key=lambda j: (now[j] - targets[j], j))
    if now[over] <= targets[over]:
        return []
    now[over] -= 1
    return [Move(over, None, 1)]


def _reason(ask: JobAsk, target: int, capacity: int) -> str:
    """One line for the fleet's log: why this job holds what it holds."""
    if target >= ask.cap:
        return (f"fed: wants {ask.want}" if ask.max_cores is None or ask.want <= ask.max_cores
                else f"capped at its max {ask.max_cores} (wants {ask.want})")
    if ask.min_cores > target:
        return f"below its min {ask.min_cores}: the fleet has {capacity} processes for every job's min"
    return f"its weighted share ({target} of {ask.cap} wanted, weight {ask.weight:g}): the fleet is short"
