"""Live bottleneck diagnosis: which stage bounds a running job, and how many worker cores it needs.

The consumer samples its cumulative counters once a second and compares the newest sample
with the one WINDOW_S earlier. The workers report their stages in CPU seconds and their waits
in wall seconds (protos StageSeconds), so the rules hold on a host that other work shares:

- the device waits less than STALL_OK of the time: **compute** bounds the job;
- the device waits while received batches sit in the prefetch queue: the consumer's own
  conversion/copy cannot keep up: **device_copy**;
- worker processes spent HUNG of their time in transform calls that ran past --transform-timeout
  (the dispatcher counts them, and skips those samples from then on): **transform**, whatever
  else they waited for (a call asleep in C code uses no CPU, so it would read as contention);
- the workers waited CONTENDED of their runnable time for a core: **throttled** when most of
  that was under a cgroup CPU quota, else **contention** (other processes took the CPU), unless
  they waited longer still for shard reads, or most of the wait was on hosts that run more worker
  processes than the cores they report (affinity or quota), and no more than 1 - cores/processes
  (plus CONTENDED) there: processes waiting for each other are workers short of cores, named as
  below;
- the workers wait STORAGE_WAIT of their time for shard reads: **storage**;
- the workers are busy (CPU) WORKERS_BUSY of their time: they are short of cores, and their
  largest stage (**decode**, **augment** or **read**; text: **examples** or **pack**) is named;
- else batches wait in transit or for credit: when batches queue on the link (a batch's transit
  from worker to consumer exceeds the quickest batch's by more than half the device's cycle per
  batch), the link is full: **wire**; otherwise the link only takes its latency and the credit
  window does not cover it: **credit**.

Cores: rows per CPU-second of the workers is what one core supplies; the device's rate when fed
is rows per step second; `cores_needed` = demand / supply, and `cores_in_use` is the workers'
CPU seconds per second now. Both are cores, wherever the workers ran and whatever shared them.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prometheus_client import CollectorRegistry, Gauge

from stoker.accel.control.failures import failed_line
from stoker.accel.control.fleet_member import Need
from stoker.accel.cost import cores_text
from stoker.accel.fleet.status import fleet_status, is_fleet
from stoker.protos.errors import ConfigError, DataError, ResourceError

WORK_STAGES = ("decode", "augment", "read", "examples", "pack")
STAGES = (*WORK_STAGES, "transform", "contention", "throttled", "storage", "wire", "credit", "device_copy", "compute",
          "unknown")
WINDOW_S = 5.0
STALL_OK = 0.05  # below this stall fraction the device is the bottleneck
WORKERS_BUSY = 0.7  # above this busy share the workers are the bottleneck
CONTENDED = 0.2  # workers that waited this share of their runnable time for a core are starved of CPU
OTHERS_SHOWN = 0.05  # on an oversubscribed machine, a wait beyond the workers' own this large is named too
STORAGE_WAIT = 0.3  # workers that wait this share of their time for reads wait for storage
HUNG = 0.1  # workers that spent this share of their time in transforms past their time limit: the transform


@dataclass
class Totals:
    """Cumulative counters of a job at one instant."""

    at: float = 0.0  # time.monotonic()
    stall_s: float = 0.0  # device waiting for input
    step_s: float = 0.0
    copy_s: float = 0.0
    rows: int = 0  # stepped
    batches: int = 0  # stepped
    received_batches: int = 0
    transit_s: float = 0.0  # summed over received batches: worker sent -> consumer received
    min_transit_s: float = float("inf")  # the quickest batch so far: latency with nothing queued on the link
    wait_for_credit_s: float = 0.0  # summed over worker processes
    work_s: dict[str, float] = field(default_factory=dict)  # worker stages in CPU seconds: decode, augment, send, ...
    queue_depth: int = 0
    cpu_s: float = 0.0  # the worker processes' whole CPU (0: not reported; the stages' sum stands in)
    cpu_wait_s: float = 0.0  # workers runnable without a core, over the batches where that was measured
    throttled_wait_s: float = 0.0  # ... of which under a throttling cgroup CPU quota
    cpu_wait_batches: int = 0  # batches whose CPU wait was measured
    read_wait_s: float = 0.0  # workers waiting for reads beyond their CPU
    host_cpu_s: dict[str, float] = field(default_factory=dict)  # cpu_s by host
    host_cpu_wait_s: dict[str, float] = field(default_factory=dict)  # cpu_wait_s by host
    host_cores: dict[str, float] = field(default_factory=dict)  # the cores a host's workers may run on (reported)
    host_procs: dict[str, int] = field(default_factory=dict)  # the worker processes a host runs (reported)
    host_machine: dict[str, tuple[str, float]] = field(default_factory=dict)  # host -> (machine id, machine cores)
    consumer_cpu_s: float = 0.0  # this consumer process's CPU (all its threads)
    consumer_machine: str = ""  # the machine it runs on (pipeline.cpu_clock.machine_id)
    hung_s: float = 0.0  # worker seconds in transform calls past --transform-timeout (the dispatcher's count)


@dataclass
class Diagnosis:
    stage: str
    stall_fraction: float
    cores_in_use: float
    cores_needed: float
    shares: dict[str, float]  # per-stage seconds over the window, per second of wall time
    detail: str
    cpu_wait_fraction: float | None = None  # of the workers' runnable time, waiting for a core; None: not measured

    def as_dict(self) -> dict:
        return asdict(self)

    def need(self) -> Need:
        """This rank's measure for its job's fleet seat (accel.control.fleet_member)."""
        return Need(self.stage != "unknown" and self.cores_needed > 0, self.cores_needed, self.stall_fraction,
                    self.cores_in_use, self.stage)


def diagnose(old: Totals, new: Totals) -> Diagnosis:
    wall = new.at - old.at
    batches = new.batches - old.batches
    if wall <= 0 or batches < 2:
        return Diagnosis("unknown", 0.0, 0.0, 0.0, {}, "not enough steps yet to judge")
    work = {k: new.work_s.get(k, 0.0) - old.work_s.get(k, 0.0) for k in new.work_s}
    busy = new.cpu_s - old.cpu_s or sum(work.values())
    waiting = new.wait_for_credit_s - old.wait_for_credit_s
    cpu_wait = new.cpu_wait_s - old.cpu_wait_s
    read_wait = new.read_wait_s - old.read_wait_s
    measured = new.cpu_wait_batches > old.cpu_wait_batches
    stall = min(1.0, (new.stall_s - old.stall_s) / wall)  # a wait that began before the window counts once
    step = new.step_s - old.step_s
    rows = new.rows - old.rows
    transit, queued = _transit(old, new)
    cycle = wall / batches  # device seconds per batch
    demand = rows / step if step > 0 else 0.0  # rows/s the device takes when fed
    supply_per_core = rows / busy if busy > 0 else 0.0  # rows per CPU-second
    cores_in_use = busy / wall
    cores_needed = demand / supply_per_core if supply_per_core else 0.0
    contended = cpu_wait / (busy + cpu_wait) if measured and busy + cpu_wait > 0 else None
    shares = {**{k: v / wall for k, v in work.items()}, "cpu": busy / wall, "wait_for_credit": waiting / wall,
              "cpu_wait": cpu_wait / wall, "read_wait": read_wait / wall, "stall": stall, "step": step / wall,
              "copy": (new.copy_s - old.copy_s) / wall, "transit_per_batch_s": transit}
    worker_time = busy + waiting + cpu_wait + read_wait
    hung_line = _hung(new.hung_s - old.hung_s, worker_time)
    busy_share = busy / worker_time if worker_time > 0 else 0.0
    device = f"the device waits {100 * stall:.0f}% of the time"
    # a slow store beside busy neighbours: both waits are real, and the longer one is what bounds the job
    storage_bound = worker_time > 0 and read_wait / worker_time >= STORAGE_WAIT
    if stall < STALL_OK:
        stage, detail = "compute", f"the device waits {100 * stall:.1f}% of the time"
    elif new.queue_depth > 0 and old.queue_depth > 0:
        stage, detail = "device_copy", f"{device} while batches queue on the consumer: conversion/copy is the limit"
    elif hung_line:
        stage, detail = "transform", f"{device}; {hung_line}"
    elif contended is not None and contended >= CONTENDED and not (storage_bound and read_wait > cpu_wait):
        stage, detail = _waited_for_a_core(old, new, contended, f"{device}; workers waited {100 * contended:.0f}% "
                                           f"of their time for a core", work, cores_in_use)
    elif storage_bound:
        stage, detail = "storage", (f"{device}; workers wait for shard reads {100 * read_wait / worker_time:.0f}% "
                                    f"of their time: storage is the limit (a faster store, the shard cache, or "
                                    f"more processes to overlap the reads)")
    elif busy_share >= WORKERS_BUSY:
        stage = max((k for k in WORK_STAGES if k in work), key=work.__getitem__)
        detail = (f"{device}; workers are busy {100 * busy_share:.0f}% of their time (CPU), most in {stage}: they are "
                  f"short of cores ({cores_in_use:.2f} busy)")
    elif queued > 0.5 * cycle:
        stage, detail = "wire", (f"{device}; batches queue on the link: a batch takes {transit:.3f} s in transit, "
                                 f"{queued:.3f} s more than the quickest, against a {cycle:.3f} s device cycle: "
                                 f"the link is full")
    else:
        credit_share = waiting / worker_time if worker_time > 0 else 0.0
        stage, detail = "credit", (f"{device} and workers wait for credit {100 * credit_share:.0f}% of their time; "
                                   f"batches do not queue on the link (transit {transit:.3f} s, the link's latency): "
                                   f"raise --credit-window")
    if contended is None and stage != "compute":
        detail += " (the workers' wait for a core is not measured on their hosts)"
    return Diagnosis(stage, stall, cores_in_use, cores_needed, shares, detail, contended)


def _transit(old: Totals, new: Totals) -> tuple[float, float]:
    """A batch's transit over the window, and the time of it queued behind other batches: transit beyond
    the quickest batch's, which is the link's latency (and, between hosts, the clocks' offset, which the
    difference cancels)."""
    transit = (new.transit_s - old.transit_s) / max(new.received_batches - old.received_batches, 1)
    return transit, max(0.0, transit - new.min_transit_s) if new.min_transit_s != float("inf") else transit


def _hung(hung: float, worker_time: float) -> str:
    """What the workers lost to transform calls past their time limit, when it is HUNG of their time ("": not)."""
    share = hung / (worker_time + hung) if hung > 0 else 0.0
    if share < HUNG:
        return ""
    return (f"worker processes spent {hung:.0f} s in transform calls that ran past --transform-timeout "
            f"({100 * share:.0f}% of their time; the worker and dispatcher logs name each sample, skipped since)")


@dataclass
class Oversubscribed:
    """Machines that run more worker processes than they give them cores: there the processes wait for
    each other, 1 - cores/processes of their runnable time, with no neighbour to blame. Emulated hosts
    of one machine (network namespaces, cgroups) share its cores, so hosts are grouped by machine."""

    waited_most: bool  # most of the window's wait for a core was on such machines, and no more than they explain
    text: str  # "4 processes on 2 cores of host0 (each waits 50% for the others)", for the diagnosis


def _machines(new: Totals) -> dict[str, list[str]]:
    """Machine id -> the hosts on it (a host that reported no machine is a machine of its own)."""
    machines: dict[str, list[str]] = {}
    for host in sorted(new.host_procs):
        machines.setdefault(new.host_machine.get(host, (host, 0.0))[0], []).append(host)
    return machines


def _oversubscribed(old: Totals, new: Totals, cpu_wait: float) -> Oversubscribed:
    found: list[str] = []
    waited = 0.0
    for hosts in _machines(new).values():
        procs = sum(new.host_procs[h] for h in hosts)
        machine_cores = max(new.host_machine.get(h, ("", new.host_cores.get(h, 0.0)))[1] for h in hosts)
        cores = min(machine_cores, sum(new.host_cores.get(h, 0.0) for h in hosts))  # quotas of hosts add up
        if not 0 < cores < procs:
            continue
        own = 1 - cores / procs  # the share of runnable time P processes on C cores wait for each other
        busy = sum(new.host_cpu_s.get(h, 0.0) - old.host_cpu_s.get(h, 0.0) for h in hosts)
        wait = sum(new.host_cpu_wait_s.get(h, 0.0) - old.host_cpu_wait_s.get(h, 0.0) for h in hosts)
        share = wait / (busy + wait) if busy + wait > 0 else 0.0
        if share <= own + CONTENDED:  # much more: neighbours take the rest, and that is contention
            where = hosts[0] if len(hosts) == 1 else f"one machine (hosts {', '.join(hosts[:4])}" + (
                f" and {len(hosts) - 4} more)" if len(hosts) > 4 else ")")
            others = f"; other processes took {100 * (share - own):.0f}% more" if share - own >= OTHERS_SHOWN else ""
            found.append(f"{procs} processes on {cores:g} cores of {where} (each waits {100 * own:.0f}% for the "
                         f"others{others})")
            waited += wait
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more machines" if len(found) > 3 else "")
    return Oversubscribed(cpu_wait > 0 and waited >= 0.5 * cpu_wait, shown)


def _waited_for_a_core(old: Totals, new: Totals, contended: float, said: str, work: dict[str, float],
                       cores_in_use: float) -> tuple[str, str]:
    """Stage and detail of workers that waited CONTENDED of their time for a core: a quota (throttled),
    each other on machines with more processes than cores (short of cores), or other processes."""
    cpu_wait = new.cpu_wait_s - old.cpu_wait_s
    quota = new.throttled_wait_s - old.throttled_wait_s >= 0.5 * cpu_wait
    oversubscribed = _oversubscribed(old, new, cpu_wait)
    if quota:
        return "throttled", f"{said}: their cgroup's CPU quota throttled them (raise the quota)"
    if not oversubscribed.waited_most:
        return "contention", (f"{said}: other processes on their hosts take the CPU (give the workers cores of their "
                              f"own){_consumer_beside(old, new, new.at - old.at)}")
    stage = max((k for k in WORK_STAGES if k in work), key=work.__getitem__)
    return stage, (f"{said}, most for each other: {oversubscribed.text}: processes beyond the cores add no CPU, so "
                   f"the workers are short of cores ({cores_in_use:.2f} busy: add cores or hosts, not processes)")


def _consumer_beside(old: Totals, new: Totals, wall: float) -> str:
    """Where this consumer shares a machine with workers, what it took of it: the job's own neighbour."""
    if not new.consumer_machine or all(m != new.consumer_machine for m, _ in new.host_machine.values()):
        return ""
    used = (new.consumer_cpu_s - old.consumer_cpu_s) / wall
    return f"; this job's consumer runs on their machine and used {used:.2f} cores of it"


class BottleneckMonitor:
    """Samples `totals()` every second on a thread and exports the diagnosis as metrics."""

    def __init__(self, totals: Callable[[], Totals], registry: CollectorRegistry, window_s: float = WINDOW_S) -> None:
        self.totals = totals
        self.window_s = window_s
        self.history: deque[Totals] = deque()
        self.latest = Diagnosis("unknown", 0.0, 0.0, 0.0, {}, "starting")
        self.info = Gauge("stoker_bottleneck_info", "1 for the stage that bounds throughput now, 0 for the others",
                          ["stage"], registry=registry)
        self.needed = Gauge("stoker_cores_needed", "Host cores (in CPU time, wherever the workers run) that would "
                                                   "keep the device from waiting", registry=registry)
        self.in_use = Gauge("stoker_cores_in_use", "Host cores the workers use now (their CPU seconds per second)",
                            registry=registry)
        self.cpu_wait = Gauge("stoker_cpu_wait_fraction", "Share of the workers' runnable time they waited for a core "
                              "(CPU taken by other processes or a quota), over the window", registry=registry)
        self.cpu_wait_measured = Gauge("stoker_cpu_wait_measured", "1 where the workers' hosts report their wait "
                                       "for a core (schedstat); 0: stoker_cpu_wait_fraction is not measured",
                                       registry=registry)
        self.stall = Gauge("stoker_stall_fraction", f"Share of the last {window_s:.0f} s the device waited for input",
                           registry=registry)
        self.shares = Gauge("stoker_stage_share", "Seconds per second of wall time, by stage, over the window",
                            ["stage"], registry=registry)
        self._set("unknown")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _set(self, stage: str) -> None:
        for name in STAGES:
            self.info.labels(stage=name).set(1 if name == stage else 0)

    def sample(self) -> Diagnosis:
        now = self.totals()
        self.history.append(now)
        while len(self.history) > 2 and now.at - self.history[1].at >= self.window_s:
            self.history.popleft()
        self.latest = diagnose(self.history[0], now)
        d = self.latest
        self._set(d.stage)
        self.needed.set(d.cores_needed)
        self.in_use.set(d.cores_in_use)
        self.cpu_wait_measured.set(0 if d.cpu_wait_fraction is None else 1)
        self.cpu_wait.set(d.cpu_wait_fraction or 0.0)
        self.stall.set(d.stall_fraction)
        for name, value in d.shares.items():
            if name != "transit_per_batch_s":
                self.shares.labels(stage=name).set(value)
        return d

    def start(self, interval_s: float = 1.0) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.sample()

        self._thread = threading.Thread(target=loop, name="stoker-bottleneck", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


ADVICE = {
    "compute": "the device is the limit: the hosts keep it fed",
    "device_copy": "the consumer's own conversion/copy is the limit",
    "transform": "the transform ran past --transform-timeout on samples (the logs name them; they are skipped)",
    "contention": "other processes on the workers' hosts take their CPU: give the workers cores of their own",
    "throttled": "a cgroup CPU quota throttles the workers: raise the quota",
    "storage": "the workers wait for shard reads: a faster store, the shard cache, or more processes",
    "wire": "the link is full",
    "credit": "workers wait for credit and batches do not queue on the link: raise --credit-window",
    **{stage: f"the workers are short of cores, most busy in {stage}" for stage in WORK_STAGES},
}


def read_status(metrics_url: str) -> dict:
    """`stoker status`: the diagnosis a running consumer exports, in words."""
    from prometheus_client.parser import text_string_to_metric_families

    if urllib.parse.urlsplit(metrics_url).scheme not in ("http", "https"):
        raise ConfigError(f"--metrics {metrics_url!r} is not an http:// or https:// URL (a consumer's /metrics, such "
                         f"as http://127.0.0.1:9560/metrics)")
    try:
        text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    except OSError as exc:
        raise ResourceError(f"cannot read {metrics_url}: {exc} (is a consumer running? pass --metrics URL)") from exc
    values: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, {})[json.dumps(sample.labels, sort_keys=True)] = sample.value
    except ValueError as exc:  # the parser's own words name a line of a page that is not metrics
        raise DataError(f"{metrics_url} is not a Prometheus metrics page ({str(exc)[:120]}): pass a Stoker "
                         f"consumer's /metrics URL with --metrics") from exc
    if is_fleet(values):
        return fleet_status(values, metrics_url)
    failure = next((json.loads(k)["reason"] for k, v in values.get("stoker_job_failed", {}).items() if v == 1), "")
    stalled = stall_lines(values)
    if "stoker_bottleneck_info" not in values and (failure or stalled):  # a `stoker dispatch`'s metrics
        lines = ([failed_line(failure)] if failure else []) + stalled
        return {"stage": "failed" if failure else "stalled", "failure": failure, "stalled": stalled,
                "text": "\n".join(lines)}
    if "stoker_bottleneck_info" not in values:
        raise DataError(f"{metrics_url} is not a Stoker consumer's metrics (no stoker_bottleneck_info)")
    stage = next((json.loads(k)["stage"] for k, v in values["stoker_bottleneck_info"].items() if v == 1), "unknown")

    def one(name: str) -> float:
        return next(iter(values.get(name, {"": 0.0}).values()))

    jobs = [json.loads(k) for k, v in values.get("stoker_consumer_job_info", {}).items() if v == 1]
    who = whose(jobs[0] if jobs else None, metrics_url)
    shares = {json.loads(k)["stage"]: v for k, v in values.get("stoker_stage_share", {}).items()}
    needed, in_use, stall = one("stoker_cores_needed"), one("stoker_cores_in_use"), one("stoker_stall_fraction")
    rows = one("stoker_consumer_samples_total")
    more = max(0.0, needed - in_use)
    measured = one("stoker_cpu_wait_measured") == 1
    cpu_wait = one("stoker_cpu_wait_fraction") if measured else None
    text_lines = [who, f"bottleneck: {stage}" + (f" ({ADVICE[stage]})" if stage in ADVICE else ""),
                  f"device stall over the last {WINDOW_S:.0f} s: {100 * stall:.1f}%",
                  f"worker cores busy (CPU time): {cores_text(in_use)}; needed to feed the device: {cores_text(needed)}"
                  + (f" (+{cores_text(more)})" if stage in WORK_STAGES else ""),
                  "workers waited for a core " + ("(not measured: their hosts give no schedstat)" if cpu_wait is None
                                                  else f"{100 * cpu_wait:.0f}% of their runnable time"),
                  f"rows stepped so far: {rows:,.0f}",
                  "seconds per second by stage: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(shares.items()))]
    text_lines[:0] = ([failed_line(failure)] if failure else []) + stalled
    return {"job": jobs[0] if jobs else None, "stage": stage, "stall_fraction": stall, "cores_in_use": in_use,
            "cores_needed": needed, "cpu_wait_fraction": cpu_wait,
            "more_cores": more, "shares": shares, "rows": rows, "failure": failure,
            "stalled": stalled, "text": "\n".join(text_lines), "hosts": _hosts(values)}


def whose(job: dict | None, metrics_url: str) -> str:
    """Whose figures these are, as the consumer's job info says: a port another job has taken since
    shows that job, not figures that look like this one's."""
    if not job:
        return f"a consumer at {metrics_url} that does not say its job"
    return f"job {job['job_id']} ({job['dataset']}), rank {job['rank']}, process {job['pid']}, at {metrics_url}"


def _hosts(values: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per worker host: rows, and seconds of credit wait, CPU and wait for a core, from the consumer's counters."""
    hosts = {json.loads(k)["host"]: {"rows": v} for k, v in values.get("stoker_consumer_host_rows_total", {}).items()}
    for metric, key in (("stoker_consumer_host_credit_wait_seconds_total", "credit_wait_s"),
                        ("stoker_consumer_host_cpu_seconds_total", "cpu_s"),
                        ("stoker_consumer_host_cpu_wait_seconds_total", "cpu_wait_s")):
        for k, v in values.get(metric, {}).items():
            hosts.setdefault(json.loads(k)["host"], {"rows": 0.0})[key] = v
    return hosts


WAIT_SHOWN_S = 5.0  # a rank's wait for its next batch is shown from this long on


def stall_lines(values: dict[str, dict[str, float]]) -> list[str]:
    """The stall watchdog's figures (accel.control.watchdog), in words: which rank waits for a batch,
    and, past --stall-report, what each process that holds a unit of its stream is doing."""
    holders = [(json.loads(k), v) for k, v in values.get("stoker_stall_holder_seconds", {}).items()]
    waiting = sorted(((json.loads(k)["rank"], v) for k, v in values.get("stoker_rank_waiting_seconds", {}).items()),
                     key=lambda item: -item[1])
    lines = [f"rank {rank} has waited {seconds:.0f} s for its next batch" for rank, seconds in waiting
             if seconds >= WAIT_SHOWN_S or (seconds > 0 and any(h["rank"] == rank for h, _ in holders))]
    for h, seconds in holders:
        doing = h["phase"] + (f" sample {h['sample']}" if h["sample"] else "")
        lines.append(f"  rank {h['rank']}'s unit {h['unit']}: held by {h['process']} (host {h['host']}), "
                     f"{doing} for {seconds:.0f} s")
    return lines


def watch_frame(old: dict | None, new: dict, seconds: float, metrics_url: str) -> str:
    """One screen of `stoker status --watch`: whose job it reads (as plain `stoker status` says), then the
    diagnosis, with rates over the last refresh."""
    if new.get("stage") == "fleet":  # a fleet's jobs: its figures are gauges already
        return new["text"]

    def rate(now: float, before: float) -> float:
        return (now - before) / seconds if old is not None and seconds > 0 else 0.0

    if "rows" not in new:  # a `stoker dispatch`'s metrics: no figures, only a failure or a stall
        return f"the dispatcher at {metrics_url}\n{new['text']}"
    lines = [whose(new["job"], metrics_url),
             f"rows/s: {rate(new['rows'], old['rows'] if old else 0):,.0f}   stall: {100 * new['stall_fraction']:.1f}%"
             f"   bottleneck: {new['stage']}   worker cores busy {cores_text(new['cores_in_use'])}, needed "
             f"{cores_text(new['cores_needed'])}",
             f"{'host':<24} {'rows/s':>10} {'CPU s/s':>8} {'core wait s/s':>14} {'credit wait s/s':>16}"]
    for host, now in sorted(new["hosts"].items()):
        before = (old or {}).get("hosts", {}).get(host, {})

        def per_s(key: str, now: dict = now, before: dict = before) -> float:
            return rate(now.get(key, 0.0), before.get(key, 0.0))

        lines.append(f"{host[:24]:<24} {per_s('rows'):>10,.0f} {per_s('cpu_s'):>8.2f} {per_s('cpu_wait_s'):>14.2f} "
                     f"{per_s('credit_wait_s'):>16.2f}")
    return "\n".join(lines)
