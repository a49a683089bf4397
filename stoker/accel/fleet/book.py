"""What a fleet knows and decides: its hosts, its jobs, and which host runs how many processes of which
job. No sockets and no clock (the caller passes `now`): `stoker fleet`'s service (fleet_service.py)
feeds it the beats it receives and sends back what it answers.

Every beat is a whole statement (a host's capacity and what it runs, a job's ask), so a fleet that
starts again rebuilds this book from the next beats: a host's report of what it runs is adopted as
its assignment when the fleet has none for it, and a job a host serves that has not registered yet
keeps its processes for `job_timeout_s`. A host silent for `host_timeout_s` is gone (its job's
dispatcher re-leases its units, as without a fleet); a job silent for `job_timeout_s`, or one that
says it is leaving, frees its processes.

Jobs ask in CPU cores (what their bottleneck monitor measures, in CPU time); hosts offer processes
and the cores those may use. The fleet turns a job's cores into processes at the fleet's cores per
process (one, where each host runs a process per core it gives Stoker, as it should; less on an
emulated host with a CPU quota), so a job that needs 3 cores gets 3 processes on real hosts and 6
on hosts that give each process half a core.

Each round (`rebalance`) asks allocation.allocate for the targets and the damped moves, and puts
each move on a host: idle processes from the host with the most free, a moved one from the host
where the giving job runs the most. Where every host has fewer cores than processes (a CPU quota),
a host's processes share its quota, so the fleet keeps hosts to one job as far as it can: a light
job's want is rounded up to a whole host, and processes go to, and move onto, hosts the job runs on.
A host told to run fewer processes of a job drains them (their units go back to that job's
dispatcher, nothing lost) before it starts another job's.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from stoker.accel.control.fleet_seat import MOST_CORES
from stoker.accel.control.serving.last_heard import LastHeard
from stoker.accel.fleet.allocation import Allocation, JobAsk, Move, allocate
from stoker.protos.errors import ConfigError

MOST_HOST_PROCS = 1024  # a host offering more is not a Stoker daemon (one caps itself at 4 a core)
MOST_PROCESSES = 1_000_000  # what a job's cores become, at most
STALL_TARGET = 0.02  # a job stalling more than this ...
CONSUMER_BOUND = ("compute", "device_copy")  # ... for a reason on the workers' side earns one process more,
HOSTS_SHORT = ("contention", "throttled")  # but not where its hosts' cores are short: a process more there shares them
HOST_TIMEOUT_S = 5.0  # a host that has not beaten for this long is gone
JOB_TIMEOUT_S = 10.0  # a job silent this long (or one a restarted fleet has not heard from yet) frees its processes
NEWCOMER_PROCESSES = 1  # what a job that has not measured (and has no estimate) is given at others' expense
ROUND_S = 1.0  # the least time between two rounds of moves: each round moves at most max_moves processes


@dataclass
class Host:
    host_id: str
    procs: int
    leaving: bool = False
    running: dict[str, int] = field(default_factory=dict)  # job -> processes the host says it runs
    cores: float = 0.0  # the CPU its processes may use in all (0: not said; one a process)
    pid: int = 0  # its daemon's: a second live daemon under the same host id is refused


@dataclass
class Job:
    job_id: str
    weight: float
    min_cores: int
    max_cores: int | None
    want_cores: float | None  # None: the job has not measured its demand yet (a small start, and idle processes)
    endpoint: str
    want_reason: str = ""
    stall_fraction: float = 0.0
    cores_needed: float = 0.0
    cores_in_use: float = 0.0
    transform: str = ""
    stage: str = ""  # what bounds it now ("": not measured)


@dataclass(frozen=True)
class Decision:
    """One line of the fleet's log: what moved, and why."""

    text: str


@dataclass(frozen=True)
class Share:
    target: int
    holding: int
    missing: int
    fleet_procs: int
    hosts: int
    reason: str


class FleetBook:
    def __init__(self, host_timeout_s: float = HOST_TIMEOUT_S, job_timeout_s: float = JOB_TIMEOUT_S,
                 round_s: float = ROUND_S, max_moves: int = 2) -> None:
        if not (host_timeout_s > 0 and job_timeout_s > 0 and round_s >= 0 and max_moves >= 1):
            raise ConfigError("the fleet's host and job timeouts must be above 0 and at least one process must "
                              "move a round")
        self.host_timeout_s = host_timeout_s
        self.job_timeout_s = job_timeout_s
        self.round_s = round_s
        self.max_moves = max_moves
        self.hosts: dict[str, Host] = {}
        self.jobs: dict[str, Job] = {}
        self.hosts_heard = LastHeard[str]()  # host -> its last beat
        self.jobs_heard = LastHeard[str]()  # job -> its last beat
        self.assigned: dict[str, dict[str, int]] = {}  # host -> job -> processes it should run
        self.last: Allocation | None = None
        self._round_at = -math.inf
        self._started: float | None = None  # the first beat this book heard: jobs it never heard get a grace
        self.moves_total = 0

    # ---- beats -------------------------------------------------------------------------------

    def host_beat(self, host_id: str, procs: int, running: dict[str, int], leaving: bool, now: float,
                  cores: float = 0.0, pid: int = 0) -> list[Decision]:
        """A host's beat; returns what changed. A new host is placed at once (it gets work within a
        second: the caller answers with `plan_for` right after)."""
        self._started = now if self._started is None else self._started
        if not 1 <= procs <= MOST_HOST_PROCS:
            raise ConfigError(f"host {host_id}: a host offers 1 to {MOST_HOST_PROCS} processes, not {procs}")
        if not (math.isfinite(cores) and 0 <= cores <= procs * 1e3):
            raise ConfigError(f"host {host_id}: its cores must be a number of at least 0, not {cores!r}")
        known, age = self.hosts.get(host_id), self.hosts_heard.age(host_id, now)
        if known is not None and age is not None and pid and known.pid and known.pid != pid \
                and age < self.host_timeout_s:
            raise ConfigError(f"host id {host_id} is in use by a live daemon (pid {known.pid}, heard "
                              f"{age:.1f} s ago): give each worker daemon its own --host-id")
        decisions = []
        if known is None:
            decisions.append(Decision(f"host {host_id} joined with {procs} processes"))
            self.hosts[host_id] = Host(host_id, procs, leaving, dict(running), cores, pid)
            if host_id not in self.assigned:  # a fleet that started again: adopt what the host runs
                self.assigned[host_id] = {job: n for job, n in running.items() if n > 0}
        else:
            if leaving and not known.leaving:
                decisions.append(Decision(f"host {host_id} is draining: its processes go to other hosts"))
            known.procs, known.leaving, known.running = procs, leaving, dict(running)
            known.cores, known.pid = cores, pid
        self.hosts_heard.record(host_id, now)
        if leaving:
            self.assigned[host_id] = {}
        else:
            self._fit_host(host_id)
        return decisions + self.rebalance(now, force=known is None)

    def job_beat(self, job: Job, now: float) -> list[Decision]:
        """A job's beat, heard at `now`; ConfigError when its weight or limits cannot hold."""
        self._started = now if self._started is None else self._started
        JobAsk(job.job_id, 0, job.weight, job.min_cores, job.max_cores)  # refused here, with one line
        if job.want_cores is not None and not 0 <= job.want_cores <= MOST_CORES:
            raise ConfigError(f"job {job.job_id}: wants {job.want_cores!r} cores, not a number from 0 to "
                              f"{MOST_CORES:.0e}")
        known = self.jobs.get(job.job_id)
        decisions = []
        wants = "a small start (not measured yet)" if job.want_cores is None else f"{job.want_cores:.2f} cores"
        if known is None:
            decisions.append(Decision(
                f"job {job.job_id} joined (weight {job.weight:g}, min {job.min_cores}, max "
                f"{'-' if job.max_cores is None else job.max_cores} cores), wants {wants}: "
                f"{job.want_reason or 'no reason given'}"))
        elif job.want_cores is not None and (known.want_cores is None or self.processes_for(known.want_cores)
                                             != self.processes_for(job.want_cores)):  # a change the fleet acts on
            decisions.append(Decision(f"job {job.job_id} now wants {wants}, {self.processes_for(job.want_cores)} "
                                      f"processes ({job.want_reason})"))
        self.jobs[job.job_id] = job
        self.jobs_heard.record(job.job_id, now)
        return decisions + self.rebalance(now, force=known is None)

    def job_leaves(self, job_id: str, now: float, why: str = "it finished") -> list[Decision]:
        self.jobs_heard.forget(job_id)
        if self.jobs.pop(job_id, None) is None:
            return []
        held = self._drop_job(job_id)
        return [Decision(f"job {job_id} left ({why}): its {held} processes are free")] + self.rebalance(now, force=True)

    def expire(self, now: float) -> list[Decision]:
        """Hosts and jobs that fell silent, and assignments of jobs nobody registered."""
        decisions = []
        for host_id in self.hosts_heard.silent_for(self.host_timeout_s, now):
            silent = now - (self.hosts_heard.forget(host_id) or 0.0)
            del self.hosts[host_id]
            lost = self.assigned.pop(host_id, {})
            decisions.append(Decision(f"host {host_id} is gone (silent {silent:.0f} s): "
                                      f"{sum(lost.values())} processes lost ({_jobs_text(lost)})"))
        for job_id in self.jobs_heard.silent_for(self.job_timeout_s, now):
            silent = now - (self.jobs_heard.forget(job_id) or 0.0)
            del self.jobs[job_id]
            held = self._drop_job(job_id)
            decisions.append(Decision(f"job {job_id} is gone (silent {silent:.0f} s): its "
                                      f"{held} processes are free"))
        if self._started is not None and now - self._started > self.job_timeout_s:
            strays = {job for jobs in self.assigned.values() for job in jobs if job not in self.jobs}
            for job_id in sorted(strays):
                held = self._drop_job(job_id)
                decisions.append(Decision(f"job {job_id} has not registered since the fleet started: its {held} "
                                          "processes are free"))
        if decisions:
            decisions += self.rebalance(now, force=True)
        return decisions

    # ---- decisions ---------------------------------------------------------------------------

    def capacity(self) -> int:
        return sum(h.procs for h in self.hosts.values() if not h.leaving)

    def cores_per_process(self) -> float:
        """What one of the fleet's processes may use: its live hosts' cores over their processes (1 where
        no host says its cores)."""
        live = [h for h in self.hosts.values() if not h.leaving]
        procs = sum(h.procs for h in live)
        cores = sum(min(h.cores, h.procs) if h.cores > 0 else h.procs for h in live)
        return cores / procs if procs else 1.0

    def processes_for(self, cores: float, per_process: float | None = None) -> int:
        """The processes that give `cores` at the fleet's cores per process (`per_process`, when the caller
        worked it out already; at most MOST_PROCESSES: what a job misses beyond the fleet is still said, and
        every figure fits the wire)."""
        per_process = per_process or self.cores_per_process()
        return max(0, min(MOST_PROCESSES, math.ceil(cores / per_process - 1e-9)))

    def ask_of(self, job: Job, capacity: int, per_process: float | None = None,
               host_procs: int | None = None) -> JobAsk:
        """A job's ask in processes. One that has not measured its demand (and was given no estimate) asks for
        NEWCOMER_PROCESSES and the processes nobody else wants: a fed job loses nothing to it beyond that
        start, and its measured need, a few seconds after its device first steps, says the rest."""
        per_process = per_process or self.cores_per_process()
        floor = self.processes_for(job.min_cores, per_process)
        most = None if job.max_cores is None else max(1, math.floor(job.max_cores / per_process + 1e-9))
        floor = floor if most is None else min(floor, most)
        want = (max(NEWCOMER_PROCESSES, floor) if job.want_cores is None
                else self.whole_host(self.processes_for(job.want_cores, per_process), host_procs))
        if job.stage and job.stage not in (*CONSUMER_BOUND, *HOSTS_SHORT) and job.stall_fraction > STALL_TARGET:
            want = max(want, min(capacity, self.holding().get(job.job_id, 0) + 1))  # stalled: one more to try
        return JobAsk(job.job_id, want, job.weight, floor, most, takes_idle=job.want_cores is None)

    def short_host_procs(self) -> int:
        """The processes of the smallest live host when every live host has fewer cores than processes (a CPU
        quota), else 0. On such hosts a host's processes share one quota, and a job's process beside another
        job's waits out the quota that job spends: the light job's latency, not the hungry job's rate, pays."""
        live = [h for h in self.hosts.values() if not h.leaving]
        short = bool(live) and all(0 < h.cores < h.procs for h in live)
        return min(h.procs for h in live) if short else 0

    def whole_host(self, want: int, host_procs: int | None = None) -> int:
        """A measured want below one host of a short fleet, rounded up to that host: a light job runs alone
        on a host rather than beside a hungry one (`python -m benchmarks fleet_price`: a light job beside
        a hungry one was fed 0.76-0.84 of its rate, 0.99 alone; the hungry one gained nothing measurable)."""
        host = self.short_host_procs() if host_procs is None else host_procs  # a round passes it once for all jobs
        return host if 0 < want < host else want

    def holding(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for jobs in self.assigned.values():
            for job, n in jobs.items():
                held[job] = held.get(job, 0) + n
        return held

    def rebalance(self, now: float, force: bool = False) -> list[Decision]:
        """One round of moves, at most one per `round_s` unless `force` (a host, or a job, came or went)."""
        if not force and now - self._round_at < self.round_s:
            return []
        self._round_at = now
        capacity = self.capacity()
        per_process = self.cores_per_process()  # once a round: a sum over every host
        host_procs = self.short_host_procs()  # once a round too
        asks = [self.ask_of(job, capacity, per_process, host_procs) for job in self.jobs.values()]
        holding = {job: n for job, n in self.holding().items() if job in self.jobs}
        self.last = allocate(capacity, asks, holding, self.max_moves)
        for job_id, job in self.jobs.items():  # its small start and the idle processes: say so
            if job.want_cores is None and not self.last.missing.get(job_id):
                self.last.reasons[job_id] = (f"not measured yet: a start of {NEWCOMER_PROCESSES} and the processes "
                                             f"no other job wants, {self.last.targets[job_id]} in all")
        decisions = []
        for move in self.last.moves:
            if move.job_from is None and move.job_to is not None:
                placed = self._place_idle(move.job_to, move.processes, together=host_procs > 0)
            else:
                placed = [where for where in (self._place(move, host_procs > 0) for _ in range(move.processes))
                          if where is not None]
            self.moves_total += len(placed)
            decisions += [Decision(self._move_text(move, where)) for where in placed]
        if not self.last.moves and host_procs:
            decisions += self._swap_apart()
        return decisions

    def plan_for(self, host_id: str) -> dict[str, tuple[str, int]]:
        """job -> (its dispatcher, processes) that `host_id` should run now."""
        return {job: (self.jobs[job].endpoint, n) for job, n in self.assigned.get(host_id, {}).items()
                if n > 0 and job in self.jobs}

    def share_of(self, job_id: str, held: dict[str, int] | None = None) -> Share:
        """What the job holds and why; `held`: every job's holding, when the caller has it (it reads every host)."""
        alloc = self.last
        target = alloc.targets.get(job_id, 0) if alloc else 0
        missing = alloc.missing.get(job_id, 0) if alloc else 0
        reason = alloc.reasons.get(job_id, "") if alloc else ""
        held = self.holding() if held is None else held
        return Share(target, held.get(job_id, 0), missing, self.capacity(), len(self.hosts), reason)

    # ---- placing -----------------------------------------------------------------------------

    def _free(self, host_id: str) -> int:
        host = self.hosts[host_id]
        return 0 if host.leaving else host.procs - sum(self.assigned.get(host_id, {}).values())

    def _place_idle(self, job_id: str, processes: int, together: bool) -> list[str]:
        """Give `job_id` up to `processes` idle processes, each on the host with the most free; of those, one that
        serves the job already (fewer daemons), then the greatest id; `together` (short hosts): one serving the job
        first. The hosts, one per process placed. One heap for the whole move: a 1,000-host fleet places a joining
        host's processes without a scan each."""
        def entry(free: int, serving: int, host: _Descending) -> tuple[int, int, _Descending, int, int]:
            """Its place in a min-heap (tuples: compared in C, a 1,000-host heap is built each move)."""
            return (-serving, -free, host, free, serving) if together else (-free, -serving, host, free, serving)

        heap = [entry(free, self.assigned.get(h, {}).get(job_id, 0), _Descending(h))
                for h in self.hosts if (free := self._free(h)) > 0]
        heapq.heapify(heap)
        placed: list[str] = []
        while heap and len(placed) < processes:
            *_, host, free, serving = heapq.heappop(heap)
            jobs = self.assigned.setdefault(host.name, {})
            jobs[job_id] = jobs.get(job_id, 0) + 1
            placed.append(host.name)
            if free > 1:
                heapq.heappush(heap, entry(free - 1, serving + 1, host))
        return placed

    def _place(self, move: Move, together: bool) -> str | None:
        """Move one process of `move` from the host where the giving job runs the most (to `job_to`, or to
        idle); returns the host, None when the giving job holds none."""
        if move.job_from is None:
            return None
        giving = [h for h, jobs in self.assigned.items() if jobs.get(move.job_from, 0) > 0]
        if not giving:
            return None
        if together and move.job_to is not None:  # short hosts: one job a host, as far as moves can
            host = max(giving, key=lambda h: (self.assigned[h].get(move.job_to or "", 0),
                                              -self.assigned[h][move.job_from or ""], h))
        else:
            host = max(giving, key=lambda h: (self.assigned[h][move.job_from or ""], h))
        self._take(host, move.job_from, 1)
        if move.job_to is not None:
            jobs = self.assigned.setdefault(host, {})
            jobs[move.job_to] = jobs.get(move.job_to, 0) + 1
        return host

    def _swap_apart(self) -> list[Decision]:
        """On short hosts, once the targets are met: one swap a round of job A's process on host Y for job B's on
        host X, where both run on both and the swap empties one of them of a job (a host freed by a job that
        left goes one process to each of two jobs that share another). Each job keeps its count; each swap
        serves one job fewer somewhere, so the swaps end."""
        shared = {h: jobs for h, jobs in self.assigned.items()
                  if len(jobs) > 1 and h in self.hosts and not self.hosts[h].leaving}
        hosts_of: dict[str, set[str]] = {}
        for host, jobs in shared.items():
            for job in jobs:
                hosts_of.setdefault(job, set()).add(host)
        for x in sorted(shared):  # b's last process on x goes to a; a's on another host y that b shares goes to b
            for b in sorted(job for job, n in shared[x].items() if n == 1):
                for a in sorted(set(shared[x]) - {b}):
                    if others := (hosts_of[a] & hosts_of[b]) - {x}:
                        return self._swap(a, b, x, min(others))
        return []

    def _swap(self, a: str, b: str, x: str, y: str) -> list[Decision]:
        """Job a's process on y becomes job b's, job b's on x job a's (each drains first, as any move)."""
        self._take(x, b, 1)
        self._take(y, a, 1)
        self.assigned[x][a] = self.assigned[x].get(a, 0) + 1
        self.assigned[y][b] = self.assigned[y].get(b, 0) + 1
        self.moves_total += 2
        why = "one job a host where processes share a CPU quota"
        return [Decision(f"a process of job {b} on {x} -> job {a}, and one of job {a} on {y} -> job {b} ({why})")]

    def _take(self, host_id: str, job_id: str, n: int) -> None:
        jobs = self.assigned[host_id]
        jobs[job_id] -= n
        if jobs[job_id] <= 0:
            del jobs[job_id]

    def _fit_host(self, host_id: str) -> None:
        """A host that offers fewer processes than it was given (restarted with fewer): the excess goes."""
        excess = -self._free(host_id)
        jobs = self.assigned.setdefault(host_id, {})
        while excess > 0 and jobs:
            job = max(jobs, key=lambda j: (jobs[j], j))
            self._take(host_id, job, 1)
            excess -= 1

    def _drop_job(self, job_id: str) -> int:
        held = 0
        for jobs in self.assigned.values():
            held += jobs.pop(job_id, 0)
        return held

    def _move_text(self, move: Move, host: str) -> str:
        if move.job_to is None:
            return f"a process of job {move.job_from} on {host} -> idle (the job holds more than it wants)"
        alloc = self.last
        reason = alloc.reasons.get(move.job_to, "") if alloc else ""
        target = alloc.targets.get(move.job_to, 0) if alloc else 0
        source = "an idle process" if move.job_from is None else f"a process of job {move.job_from}"
        return (f"{source} on {host} -> job {move.job_to} (target {target}: {reason})" if reason
                else f"{source} on {host} -> job {move.job_to}")


def _jobs_text(jobs: dict[str, int]) -> str:
    return ", ".join(f"{job}: {n}" for job, n in sorted(jobs.items())) or "none"


@dataclass(frozen=True)
class _Descending:
    """A host id that sorts backwards, so a min-heap pops the greatest id first among equals."""

    name: str

    def __lt__(self, other: _Descending) -> bool:
        return self.name > other.name
