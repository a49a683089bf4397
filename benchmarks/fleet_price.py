"""The fleet's price (issue "At the limits", item 3): what a fleet that shares hosts by live need delivers,
against the best fixed split of the same hosts, found by a sweep; and how long it takes to get there.

`stoker lab up --fleet`: HOSTS emulated hosts (network namespaces), each PROCS worker processes under a CPU quota of
CORES_PER_HOST; the fleet and the jobs in the accelerator's namespace, every link CURVE. The jobs are simulated A100s
at profile rates, as `benchmarks/fleet.py` makes them: BERT-large at 512 (210 seq/s, a light job here) and ResNet-50
sized by this machine's calibration (one pinned core, CPU time) so that the jobs together need LOAD of the hosts'
cores: two jobs (ResNet-50, BERT) and three (ResNet-50 A and B, 2:1, and BERT).

The objective, the same for the fleet and the splits: the sum over the jobs of each device's fed fraction, samples
stepped per second over the samples per second its simulated device consumes (1 - stall: 1.0 is a device that never
waits), over the last WINDOW_S of a run. A fleet run starts the jobs (weight 1, `--fleet-start-cores` at the plan)
on fleet hosts that are up and idle, and runs FLEET_RUN_S; a split run gives each job a fixed set of whole hosts
whose daemons serve only its dispatcher (`stoker worker --dispatcher`, no fleet), for every composition of the hosts
(each job at least one), and runs SPLIT_RUN_S from every job's first step. The fleet's runs are repeated and
interleaved with the splits, so a machine that gets busier weighs on both. Also: when the fleet's objective
(trailing TRAIL_S) last entered a band of BAND around its final value, when its allocation last moved, and the
cores the hosts and the machine used.

    python -m benchmarks fleet_price [REPEATS]     # root; about 16 minutes here (3 repeats)
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fleet import _job_id, _scrape, _wait, calibrated
from benchmarks.report import header, write_results
from stoker.accel.backends.profiles import profile_rate
from stoker.accel.control.fleet_member import HEADROOM
from stoker.datasets import default_imagenet, default_wikipedia

HOSTS, PROCS, CORES_PER_HOST = 4, 2, 0.2  # 0.8 core of quota: the machine's other 1.2 for the consumers (and others)
LOAD = 0.9  # the jobs together need this share of the hosts' cores (calibrated, before the fleet's headroom)
FLEET_RUN_S, SPLIT_RUN_S, WINDOW_S, TRAIL_S, BAND = 80.0, 35.0, 20.0, 5.0, 0.05  # a split's from every job's 1st step
REPEATS, TICK_S = 3, 0.5
BERT_BATCH = 16  # BERT's 210 seq/s in batches of 16: 13 steps a second, so a 5 s window is not 16 steps' worth


@dataclass(frozen=True)
class Spec:
    """One job: its lab name (job0.., its key and ports), what it is, its scale and its planned cores."""

    name: str
    kind: str
    dataset: str
    scale: float
    need: float

    @property
    def rate(self) -> float:
        return profile_rate("a100", self.dataset, self.scale)

    def args(self, seconds: float, fleet: bool) -> list[str]:
        common = ["--accel", "simulated", "--profile", "a100", "--scale", f"{self.scale:g}", "--epochs", "1000",
                  "--max-seconds", f"{seconds + 60:g}"]  # a safety: the run stops its jobs when it has read them
        data = (["--dataset", "wikipedia", "--data", str(default_wikipedia()), "--seq-len", "512", "--batch-size",
                 str(BERT_BATCH)] if self.dataset == "wikipedia" else ["--data", str(default_imagenet())])
        seat = ["--weight", "1", "--fleet-start-cores", f"{self.need * HEADROOM:.3f}"] if fleet else []
        return [*common, *data, *seat]


def scenarios(rates: dict[str, float]) -> dict[str, list[Spec]]:
    """The two shapes, sized from the calibration: ResNet-50 takes what BERT leaves of LOAD x the hosts' cores."""
    bert = profile_rate("a100", "wikipedia", 1.0) / rates["bert"]
    left = LOAD * HOSTS * CORES_PER_HOST - bert

    def resnet(name: str, kind: str, cores: float) -> Spec:
        scale = round(min(1.0, cores * rates["resnet"] / profile_rate("a100", "imagenet", 1.0)), 3)
        return Spec(name, kind, "imagenet", scale, scale * profile_rate("a100", "imagenet", 1.0) / rates["resnet"])

    return {"two": [resnet("job0", "resnet-50", left), Spec("job1", "bert", "wikipedia", 1.0, bert)],
            "three": [resnet("job0", "resnet-50 A", left * 2 / 3), resnet("job1", "resnet-50 B", left / 3),
                      Spec("job2", "bert", "wikipedia", 1.0, bert)]}


def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to give `total` hosts to `parts` jobs, each at least one, in order."""
    if parts == 1:
        return [(total,)]
    return [(first, *rest) for first in range(1, total - parts + 2) for rest in compositions(total - first, parts - 1)]


# ---- the lab's hosts and jobs --------------------------------------------------------------------------------
def start_hosts(dispatchers: list[str] | None) -> None:
    """Each host's daemon, in its namespace and cgroup: serving the fleet (None), or host i serving the one
    dispatcher dispatchers[i]."""
    from stoker.configured import command_line
    from stoker.lab.cluster import WORKER_METRICS_PORT, Member, _spawn, current, names, state_dir
    from stoker.workers.worker_config import WorkerConfig

    state = current()
    for index in range(HOSTS):
        name, address = f"h{index}", names().host_address(index)
        member = Member(name, address, f"{names().prefix}{name}", log=str(state_dir() / f"{name}.log"),
                        metrics=f"http://{address}:{WORKER_METRICS_PORT}/metrics")
        worker = WorkerConfig(dispatchers[index] if dispatchers else "",
                              fleet="" if dispatchers else state.fleet_endpoint, procs=PROCS, host_id=name,
                              metrics_addr=address, metrics_port=WORKER_METRICS_PORT, keys=str(state_dir() / "keys"),
                              key_name=name)
        cgroup = Path(state.cgroups[0]) / name if state.cgroups else None
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", *command_line(worker)]
        member.pid = _spawn(cmd, member.netns, cgroup, Path(member.log))
        state.members[name] = member
    state.save()


def stop(names_: list[str], timeout_s: float = 8.0) -> None:
    """SIGTERM each member's session (a daemon and its processes), SIGKILL what is left after `timeout_s`."""
    from stoker.lab.cluster import current
    from stoker.lab.processes import _signal_group, alive

    pids = [m.pid for n, m in current().members.items() if n in names_ and m.pid is not None]
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)


def start_jobs(specs: list[Spec], seconds: float, fleet: bool) -> dict[str, str]:
    """The jobs, in the accelerator's namespace (with the fleet: `stoker lab job`'s way); each job's /metrics."""
    from stoker.lab.cluster import _spawn, current, state_dir
    from stoker.lab.fleet_lab import JOB_DATA_PORT, JOB_METRICS_PORT, start_job

    urls = {}
    for spec in specs:
        if fleet:
            urls[spec.name] = start_job(spec.name, spec.args(seconds, fleet=True)).metrics
            continue
        state, index = current(), int(spec.name[3:])
        address = state.consumer.address
        member = dataclasses.replace(state.consumer, name=spec.name, log=str(state_dir() / f"{spec.name}.log"),
                                     metrics=f"http://{address}:{JOB_METRICS_PORT + index}/metrics")
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "train", "--no-progress",
               "--data-bind", f"tcp://{address}:{JOB_DATA_PORT + 2 * index}", "--control-bind", control(index),
               "--metrics-addr", address, "--metrics-port", str(JOB_METRICS_PORT + index),
               "--keys", str(state_dir() / "keys"), *spec.args(seconds, fleet=False)]
        member.pid = _spawn(cmd, member.netns, None, Path(member.log))
        state.members[spec.name] = member
        state.save()
        urls[spec.name] = member.metrics
    return urls


def control(index: int) -> str:
    """Job `index`'s dispatcher (the lab's port scheme for jobs: stoker.lab.fleet_lab)."""
    from stoker.lab.cluster import current
    from stoker.lab.fleet_lab import JOB_DATA_PORT

    return f"tcp://{current().consumer.address}:{JOB_DATA_PORT + 2 * index + 1}"


# ---- what a run reads every TICK_S ---------------------------------------------------------------------------
def _cpu_seconds(pid: int | None, children: bool = False) -> float:
    """A process's CPU time (with `children`, that of the children it has reaped too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = sum(int(f) for f in fields[11:15 if children else 13])
    return ticks / os.sysconf("SC_CLK_TCK")


def _hosts_cpu_seconds(cgroups: list[Path]) -> float:
    """CPU time of every process in the hosts' cgroups, with the children they reaped (a fleet host's job
    daemons run in sessions of their own, so the lab's per-session sum would miss them)."""
    from stoker.lab.system import cgroup_pids

    return sum(_cpu_seconds(pid, children=True) for path in cgroups for pid in cgroup_pids(path))


def _machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sampler:
    """Each job's samples, the fleet's processes per job, the hosts' and the fleet's CPU time, the machine's."""

    urls: dict[str, str]
    fleet: bool
    points: list[dict] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from stoker.lab.cluster import Member, current

        state = current()
        hosts = [Path(state.cgroups[0]) / f"h{index}" for index in range(HOSTS)]
        ids: dict[str, str] = {}
        start = time.monotonic()
        while not self.stop.wait(TICK_S):
            point: dict = {"t": time.monotonic() - start, "samples": {}, "processes": {},
                           "hosts_cpu": _hosts_cpu_seconds(hosts), "machine_cpu": _machine_busy_seconds(),
                           "fleet_cpu": _cpu_seconds(state.consumer.pid)}
            for name, url in self.urls.items():
                values = _scrape(url) or {}
                if "stoker_consumer_samples_total" in values:
                    point["samples"][name] = values["stoker_consumer_samples_total"]
                if self.fleet and name not in ids and values:
                    ids[name] = _job_id(Member(name, "", None, metrics=url)) or ""
            fleet = _scrape(state.consumer.metrics) if self.fleet else None
            for name, job_id in ids.items():
                held = (fleet or {}).get(f"stoker_fleet_job_processes{{job={job_id}}}")
                if held is not None:
                    point["processes"][name] = held
            self.points.append(point)


def sampled(urls: dict[str, str], fleet: bool, seconds: float) -> list[dict]:
    """Sample the run for `seconds` from now (the jobs were just started)."""
    sampler = Sampler(urls, fleet)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    time.sleep(seconds)
    sampler.stop.set()
    thread.join(timeout=10)
    return sampler.points


# ---- figures of a run ----------------------------------------------------------------------------------------
def _at(points: list[dict], t: float) -> dict:
    return min(points, key=lambda p: abs(p["t"] - t))


def fed(points: list[dict], specs: list[Spec], t0: float, t1: float) -> dict[str, float]:
    """Each job's samples per second over [t0, t1] over its device's rate."""
    a, b = _at(points, t0), _at(points, t1)
    span = max(b["t"] - a["t"], 1e-9)
    return {s.name: (b["samples"].get(s.name, 0.0) - a["samples"].get(s.name, 0.0)) / span / s.rate for s in specs}


def window(points: list[dict], specs: list[Spec], end: float) -> dict:
    """The objective and its parts over the last WINDOW_S before `end`, and the cores used meanwhile."""
    a, b = _at(points, end - WINDOW_S), _at(points, end)
    span = b["t"] - a["t"]
    parts = fed(points, specs, end - WINDOW_S, end)
    return {"objective": sum(parts.values()), "fed": parts, "hosts_cores": (b["hosts_cpu"] - a["hosts_cpu"]) / span,
            "machine_cores": (b["machine_cpu"] - a["machine_cpu"]) / span,
            "fleet_cores": (b["fleet_cpu"] - a["fleet_cpu"]) / span}


def convergence(points: list[dict], specs: list[Spec], final: float) -> dict:
    """When the objective (trailing TRAIL_S) last came into BAND of `final` and stayed, and when the fleet's
    allocation last changed, in seconds from the jobs' start."""
    series = [(p["t"], sum(fed(points, specs, p["t"] - TRAIL_S, p["t"]).values()))
              for p in points if p["t"] >= TRAIL_S]
    held = [tuple(p["processes"].get(s.name) for s in specs) for p in points]
    moved = [p["t"] for p, before, now in zip(points[1:], held, held[1:], strict=False) if now != before]
    return {"within_band_s": band_entry(series, final), "allocation_last_moved_s": moved[-1] if moved else None,
            "moves_in_window": sum(1 for t in moved if t > points[-1]["t"] - WINDOW_S),
            "series": [(round(t, 1), round(v, 3)) for t, v in series[::2]],
            "allocation": [(round(p["t"], 1), h) for p, h in zip(points, held, strict=False)][::4]}


def band_entry(series: list[tuple[float, float]], final: float) -> float | None:
    """The first time after which the objective stays within BAND of `final` to the end; None where that is
    inside the final window (it did not hold through it: not a value it settled at)."""
    outside = [t for t, value in series if abs(value - final) > BAND * final]
    entry = next((t for t, _ in series if not outside or t > outside[-1]), None)
    return None if entry is None or entry > series[-1][0] - WINDOW_S else entry


def fleet_run(specs: list[Spec]) -> dict:
    from stoker.lab.cluster import current

    start_hosts(None)
    fleet_url = current().consumer.metrics
    _wait(lambda: (_scrape(fleet_url) or {}).get("stoker_fleet_processes") == HOSTS * PROCS, 60,
          "every fleet host registered")
    points = sampled(start_jobs(specs, FLEET_RUN_S, fleet=True), True, FLEET_RUN_S)
    stop([s.name for s in specs])  # SIGTERM: each job ends as a time-boxed one does, and says so to the fleet
    stop([f"h{i}" for i in range(HOSTS)])
    figures = window(points, specs, points[-1]["t"])
    stepping = next((p["t"] for p in points if all(p["samples"].get(s.name) for s in specs)), 0.0)
    whole = fed(points, specs, stepping, points[-1]["t"])
    return {**figures, "processes": points[-1]["processes"], "objective_whole_run": sum(whole.values()),
            **convergence(points, specs, figures["objective"])}


def split_run(specs: list[Spec], split: tuple[int, ...]) -> dict:
    from stoker.lab.cluster import current, wait_for_metrics

    urls = start_jobs(specs, SPLIT_RUN_S, fleet=False)
    for spec in specs:
        wait_for_metrics(current().members[spec.name], spec.name)
    owners = [index for index, hosts in enumerate(split) for _ in range(hosts)]
    start_hosts([control(int(specs[j].name[3:])) for j in owners])
    _wait(lambda: all((_scrape(url) or {}).get("stoker_consumer_samples_total") for url in urls.values()), 120,
          "every job's first step")  # its hosts' processes start under their quota: seconds of imports
    points = sampled(urls, False, SPLIT_RUN_S)
    stop([s.name for s in specs])
    stop([f"h{i}" for i in range(HOSTS)])
    return {"split": list(split), **window(points, specs, points[-1]["t"])}


# ---- the sweep, the repeats, the table -----------------------------------------------------------------------
def scenario(specs: list[Spec], repeats: int) -> dict:
    """The fleet `repeats` times and every split once, interleaved: fleet, split, fleet, split..."""
    splits = compositions(HOSTS, len(specs))
    fleet_runs: list[dict] = []
    split_runs: list[dict] = []
    for turn in range(max(repeats, len(splits))):
        if turn < repeats:
            fleet_runs.append(fleet_run(specs))
            run = fleet_runs[-1]
            print(f"  fleet: {_brief(run, specs)}, within {BAND:.0%}: {_s(run['within_band_s'])}, "
                  f"last move {_s(run['allocation_last_moved_s'])}", flush=True)
        if turn < len(splits):
            split_runs.append(split_run(specs, splits[turn]))
            print(f"  split {'/'.join(map(str, splits[turn]))}: {_brief(split_runs[-1], specs)}", flush=True)
    return summarized({"jobs": [dataclasses.asdict(s) | {"rate": s.rate} for s in specs], "fleet_runs": fleet_runs,
                       "splits": split_runs})


def summarized(shape: dict) -> dict:
    """A shape's runs with their figures: the fleet's medians, the best split, the ratio."""
    runs = shape["fleet_runs"]
    best = max(shape["splits"], key=lambda r: r["objective"])
    fleet = statistics.median(r["objective"] for r in runs)
    return {**shape, "fleet_objective": fleet, "best_split": best["split"], "best_split_objective": best["objective"],
            "ratio": fleet / best["objective"], "within_band_s": _median([r["within_band_s"] for r in runs]),
            "allocation_last_moved_s": _median([r["allocation_last_moved_s"] for r in runs]),
            "runs_moving_in_window": sum(1 for r in runs if r["moves_in_window"])}


def _median(values: list[float | None]) -> float | None:
    """The median, None when any run never got there (it is then not a figure of every run)."""
    return None if any(v is None for v in values) or not values else statistics.median(values)  # type: ignore[type-var]


def _brief(run: dict, specs: list[Spec]) -> str:
    return (f"objective {run['objective']:.3f} (" + ", ".join(f"{s.kind} {run['fed'][s.name]:.2f}" for s in specs)
            + f"), hosts {run['hosts_cores']:.2f} cores, machine {run['machine_cores']:.2f}")


def main(repeats: int = REPEATS) -> dict:
    os.environ.setdefault("STOKER_LAB_DIR", tempfile.mkdtemp(prefix="stoker-price-lab-"))
    from stoker.lab import cluster
    from stoker.lab.fleet_lab import FleetLab

    began = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("fleet_price: SIGTERM"))  # so the lab comes down
    rates = calibrated()
    shapes = scenarios(rates)
    print(f"calibrated (CPU time, one pinned core): {rates['resnet']:,.0f} images/s, {rates['bert']:,.0f} sequences/s; "
          + "; ".join(f"{n}: " + ", ".join(f"{s.kind} scale {s.scale:g} = {s.need:.3f} cores" for s in specs)
                      for n, specs in shapes.items()), flush=True)
    state = FleetLab(cluster.LabConfig(hosts=HOSTS, cores_per_host=CORES_PER_HOST, procs=PROCS, fleet=True)).up([])
    results = {}
    try:
        if state.mode != "netns" or not state.cgroups:
            raise RuntimeError(f"the lab needs network namespaces and CPU quotas (root): {state.note}")
        stop([f"h{i}" for i in range(HOSTS)])  # each run starts the hosts it needs
        for name, specs in shapes.items():
            print(f"{name} jobs:", flush=True)
            results[name] = scenario(specs, repeats)
    finally:
        cluster.down()
    result = {**header("fleet_price", "protobuf"), "hosts": HOSTS, "procs_per_host": PROCS,
              "cores_per_host": CORES_PER_HOST, "load": LOAD, "calibrated_per_core": rates, "repeats": repeats,
              "fleet_run_s": FLEET_RUN_S, "split_run_s": SPLIT_RUN_S, "window_s": WINDOW_S, "trail_s": TRAIL_S,
              "band": BAND, "scenarios": results, "wall_s": time.monotonic() - began}
    write_results("fleet_price", result, table(result))
    print(table(result))
    return result


def table(result: dict) -> str:
    lines = [f"Made by `python -m benchmarks fleet_price` on {result['when']}, {result['machine']}, {result['cpu']}; "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + f". {result['hosts']} lab hosts x "
             f"{result['procs_per_host']} processes under a {result['cores_per_host']}-core quota each; the jobs "
             f"need {result['load']:.0%} of those cores by the calibration; objective: the sum of the devices' fed "
             f"fractions over the last {result['window_s']:g} s of a run; fleet: median of {result['repeats']} "
             f"runs; {result['wall_s'] / 60:.1f} minutes in all.", "",
             "| jobs (planned cores) | fleet | best split of the hosts | fleet / best split | fleet within "
             f"{result['band']:.0%} of its final value | its allocation last moved | fleet over its whole run |",
             "|---|---|---|---|---|---|---|"]
    for shape in result["scenarios"].values():
        jobs = ", ".join(f"{j['kind']} {j['need']:.2f}" for j in shape["jobs"])
        whole = statistics.median(r["objective_whole_run"] for r in shape["fleet_runs"])
        lines.append(f"| {jobs} | {shape['fleet_objective']:.3f} | {'/'.join(map(str, shape['best_split']))}: "
                     f"{shape['best_split_objective']:.3f} | {shape['ratio']:.3f} | {_s(shape['within_band_s'])} | "
                     f"{_s(shape['allocation_last_moved_s'])}{_moving(shape, result['window_s'])} | {whole:.3f} |")
    for shape in result["scenarios"].values():
        kinds = [j["kind"] for j in shape["jobs"]]
        lines += ["", "| run | objective | " + " | ".join(f"{k} fed" for k in kinds)
                  + " | fleet processes | hosts' cores used | machine's cores busy | fleet's CPU |",
                  "|---|---|" + "---|" * len(kinds) + "---|---|---|---|"]
        for run in shape["fleet_runs"] + shape["splits"]:
            what = f"split {'/'.join(map(str, run['split']))}" if "split" in run else (
                f"fleet (within band {_s(run['within_band_s'])}, last move {_s(run['allocation_last_moved_s'])}, "
                f"{run['moves_in_window']} changes in the window)")
            held = "/".join(f"{run['processes'].get(j['name'], 0):.0f}" for j in shape["jobs"]) if "split" not in run \
                else "-"
            fleet_cpu = f"{run['fleet_cores']:.3f}" if "split" not in run else "-"
            lines.append(f"| {what} | {run['objective']:.3f} | " + " | ".join(f"{run['fed'][j['name']]:.3f}"
                                                                            for j in shape["jobs"])
                         + f" | {held} | {run['hosts_cores']:.2f} | {run['machine_cores']:.2f} | {fleet_cpu} |")
    return "\n".join(lines) + "\n"


def _moving(shape: dict, window_s: float) -> str:
    moving = shape["runs_moving_in_window"]
    return f" (still moving in the last {window_s:g} s in {moving} of {len(shape['fleet_runs'])})" if moving else ""


def _s(seconds: float | None) -> str:
    return "not within the run" if seconds is None else f"{seconds:.1f} s"


def rewrite_results() -> None:
    """The figures again from the results file's runs (after a change in how they are derived: the band's entry
    from each run's stored series, at 1 s), and the table."""
    import json

    from benchmarks.report import RESULTS

    result = json.loads((RESULTS / "fleet_price.json").read_text())
    for name, shape in result["scenarios"].items():
        for run in shape["fleet_runs"]:
            run["within_band_s"] = band_entry([tuple(p) for p in run["series"]], run["objective"])
        result["scenarios"][name] = summarized(shape)
    write_results("fleet_price", result, table(result))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
