"""`stoker sweep`: the CPU:accelerator ratio experiment on the emulated cluster.

Each point of the grid (hosts x cores per host x processes per host) is one `stoker lab`:
worker hosts in their own namespaces and CPU quotas feed one consumer that steps a simulated
accelerator at a named profile's rate, scaled to this machine. The consumer runs a
time-boxed job (`--max-seconds`), so every point measures the same steady window whatever
its speed. A point's row holds what the device consumed (rows/s), its stall fraction, the
per-stage seconds, the CPU the hosts used and the bytes on the wire. Rows are appended to
`points.jsonl` as they finish, so an interrupted sweep continues where it stopped; the
table (Parquet, CSV, Markdown) and the plots are written from all rows at the end.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from itertools import product
from pathlib import Path

from tqdm import tqdm

from stoker.accel.backends.profiles import profile_rate
from stoker.accel.bottleneck import CONTENDED
from stoker.pipeline.kinds import kind_of
from stoker.pipeline.store.files import write_atomically
from stoker.planning import transform_key
from stoker.protos.errors import ConfigError

log = logging.getLogger("stoker.sweep")

KNEE_STALL = 0.02  # the knee: the fewest cores whose stall fraction is below this
# A point whose workers waited this share of their runnable time for a core beyond their own quota's
# throttling (other work on the machine took it) measured the neighbours: marked, and left out of the knee
# and the per-core rate (accel.bottleneck.CONTENDED).
DISTURBED = CONTENDED


@dataclass(frozen=True)
class SweepConfig:
    out: Path
    dataset: str = "imagenet"
    hosts: tuple[int, ...] = (1, 2, 3, 4)
    cores_per_host: tuple[float, ...] = ()  # empty: the dataset kind's small_scale.sweep_cores
    procs: tuple[int, ...] = (1,)
    profile: str = "ipu-pod16"
    scale: float | None = None  # None: the dataset kind's small_scale.sweep
    seconds: float = 10.0  # steady measurement per point
    batch_size: int = 64
    seq_len: int = 512  # wikipedia: the profiles' BERT rates are at length 512
    data: str | None = None  # manifest; None: the dataset's default set
    loopback: bool = False
    train_args: tuple[str, ...] = ()  # more `stoker train` options; with --accel, a real step replaces the profile
    ranks: int = 1  # the profile's system as this many data-parallel ranks, each 1/ranks of its rate
    transform: str = "train"  # the job's image transform (`stoker train --transform`), its JSON parameters
    transform_params: str = ""
    rate: float | None = None  # rows/s of the simulated device instead of the profile's (`stoker plan --check`)
    need_quotas: bool = False  # refuse a lab without CPU quotas instead of warning

    def __post_init__(self) -> None:
        if kind_of(self.dataset).text and (self.transform, self.transform_params) != ("train", ""):
            raise ConfigError(f"--transform names an image transform; a {self.dataset} sweep has none")

    @property
    def transform_args(self) -> list[str]:
        """What the consumer's `stoker train` is told: nothing for the default."""
        named = ["--transform", self.transform] if self.transform != "train" else []
        return named + (["--transform-params", self.transform_params] if self.transform_params else [])

    @property
    def real_step(self) -> bool:
        return "--accel" in self.train_args

    @property
    def effective_scale(self) -> float:
        if self.real_step or self.rate is not None:
            return 1.0  # a real step is measured at its own size
        return self.scale if self.scale is not None else kind_of(self.dataset).small_scale.sweep

    @property
    def grid(self) -> list[tuple[int, float, int]]:
        cores = self.cores_per_host or kind_of(self.dataset).small_scale.sweep_cores
        return sorted(product(self.hosts, cores, self.procs), key=lambda p: (p[0] * p[1], p))


@dataclass
class Point:
    dataset: str
    hosts: int
    cores_per_host: float
    procs: int
    total_cores: float  # host cores feeding the accelerator
    profile: str
    scale: float
    accel_rate: float  # rows/s the scaled accelerator consumes when never waiting (0: a real step, unknown)
    rows_per_s: float  # what it consumed
    stall_fraction: float
    cpu_seconds: float  # used by the worker hosts over the point
    cores_used: float  # cpu_seconds / elapsed
    bytes_received: int
    wire_mb_per_s: float
    elapsed_s: float
    startup_s: float
    stage_seconds: dict[str, float] = field(default_factory=dict)
    transform: str = "train"  # points written before transforms were named ran the built-in train crop
    transform_params: str = ""
    # of the workers' runnable time, waiting for a core their quota allowed them (taken by other work);
    # None: not measured (no schedstat, or a point written before it was)
    contention: float | None = None
    sequences_per_row: float = 1.0  # text packed: the sequences one row carries (samples per row)

    @property
    def disturbed(self) -> bool:
        return self.contention is not None and self.contention >= DISTURBED

    @property
    def key(self) -> str:
        return point_key(self.dataset, self.hosts, self.cores_per_host, self.procs)

    @property
    def transform_named(self) -> str:
        return transform_key(self.transform, self.transform_params)

    @property
    def cores_per_system(self) -> float:
        """Host cores per full-size accelerator system (the scale undone)."""
        return self.total_cores / self.scale

    @property
    def time_to_train_h(self) -> float:
        """Projected for the full-size system fed like this point: its samples to train (stoker.planning)
        over the delivered rate with the scale undone."""
        delivered = self.rows_per_s * self.sequences_per_row / self.scale
        return kind_of(self.dataset).workload.samples / max(delivered, 1e-9) / 3600


def contention_of(stage_seconds: dict[str, float]) -> float | None:
    """The wait for a core that no quota explains, over the workers' runnable time (None: not measured)."""
    cpu, waited = stage_seconds.get("cpu", 0.0), stage_seconds.get("cpu_wait")
    if waited is None or cpu + waited <= 0:
        return None
    return max(0.0, waited - stage_seconds.get("throttled_wait", 0.0)) / (cpu + waited)


def point_key(dataset: str, hosts: int, cores: float, procs: int) -> str:
    return f"{dataset}/{hosts}x{cores:g}x{procs}"


def default_out(dataset: str, transform: str = "train", params: str = "") -> Path:
    """sweeps/DATASET, and a folder of its own for another transform, so a resume never mixes two."""
    if transform == "train" and not params:
        return Path("sweeps") / dataset
    name = re.sub(r"[^A-Za-z0-9_.]+", "-", transform_key(transform, params)).strip("-")
    return Path("sweeps") / f"{dataset}-{name}"


def load_points(out: Path) -> list[Point]:
    path = out / "points.jsonl"
    if not path.exists():
        return []
    return [Point(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def measure_point(cfg: SweepConfig, hosts: int, cores: float, procs: int, manifest: str) -> Point:
    """One lab: up, the time-boxed job, its summary and the hosts' CPU, down (also on failure)."""
    from stoker.lab import cluster
    from stoker.lab.system import LabError

    scale = cfg.effective_scale
    if cfg.real_step:
        device: list[str] = []
    elif cfg.rate is not None:
        device = ["--accel", "simulated", "--rate", str(cfg.rate / cfg.ranks)]
    else:  # each rank is its share of the system
        device = ["--accel", "simulated", "--profile", cfg.profile, "--scale", str(scale / cfg.ranks)]
    train = ["--data", manifest, "--dataset", cfg.dataset, *device, "--epochs", "1000",
             "--batch-size", str(cfg.batch_size), "--max-seconds", str(cfg.seconds), "--seq-len", str(cfg.seq_len),
             *cfg.transform_args, *cfg.train_args]
    lab = cluster.Lab(cluster.LabConfig(hosts=hosts, cores_per_host=cores, procs=procs, loopback=cfg.loopback,
                                        ranks=cfg.ranks))
    try:
        state = lab.up(train)
        if not state.cgroups and cfg.need_quotas:
            raise LabError(f"no CPU quotas in this lab ({state.note.lstrip('; ') or 'no cgroup'}): the check needs "
                           "them; run as root on a host with cgroups (stoker lab)")
        if not state.cgroups:
            log.warning("no CPU quotas in this lab (%s): --cores-per-host does not limit the hosts, so the "
                        "points differ only in hosts and processes; run as root for quotas", state.note.lstrip("; "))
        cpu_before = cluster.hosts_cpu_seconds(state)
        summary = cluster.wait(timeout_s=cfg.seconds * 6 + 120)
        cpu = cluster.hosts_cpu_seconds(state) - cpu_before
    finally:
        cluster.down()
    elapsed = summary["elapsed_s"]
    steady = max(elapsed - summary["startup_s"], 1e-9)
    return Point(dataset=cfg.dataset, hosts=hosts, cores_per_host=cores, procs=procs, total_cores=hosts * cores,
                 profile="real step" if cfg.real_step else f"{cfg.rate:g} rows/s" if cfg.rate else cfg.profile,
                 scale=scale, accel_rate=0.0 if cfg.real_step else cfg.rate or profile_rate(cfg.profile, cfg.dataset,
                                                                                          scale),
                 rows_per_s=summary["rows_per_s"], stall_fraction=summary["stall_fraction"], cpu_seconds=cpu,
                 cores_used=cpu / elapsed, bytes_received=summary["bytes_received"],
                 wire_mb_per_s=summary["bytes_received"] / steady / 1e6, elapsed_s=elapsed,
                 startup_s=summary["startup_s"], stage_seconds=summary["stage_seconds"], transform=cfg.transform,
                 transform_params=cfg.transform_params,
                 contention=contention_of(summary["stage_seconds"]) if summary.get("cpu_wait_fraction") is not None
                 else None,
                 sequences_per_row=summary["sequences"] / summary["rows"] if summary.get("sequences") and
                 summary.get("rows") else 1.0)


def run_sweep(cfg: SweepConfig, manifest: str, progress: bool = True,
              measure: Callable[..., Point] = measure_point) -> list[Point]:
    """Every point of the grid not already in cfg.out/points.jsonl; returns all points."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    done = {p.key: p for p in load_points(cfg.out)}
    other = {p.transform_named for p in done.values()} - {transform_key(cfg.transform, cfg.transform_params)}
    if other:
        raise ConfigError(f"{cfg.out} holds points of transform {', '.join(sorted(other))}: give this sweep "
                         f"another --out (the default folder is per transform)")
    todo = [g for g in cfg.grid if point_key(cfg.dataset, *g) not in done]
    if done:
        log.warning("resuming: %d of %d points already measured in %s", len(cfg.grid) - len(todo), len(cfg.grid),
                    cfg.out)
    bar = tqdm(total=len(cfg.grid), initial=len(cfg.grid) - len(todo), desc=f"sweep {cfg.dataset}", unit="point",
               disable=not progress)
    with open(cfg.out / "points.jsonl", "a") as sink:
        for hosts, cores, procs in todo:
            bar.set_postfix_str(f"{hosts} host(s) x {cores:g} core(s) x {procs} proc(s)")
            point = measure(cfg, hosts, cores, procs, manifest)
            if point.disturbed:
                log.warning("%s: the workers waited %.0f%% of their runnable time for a core their quota allowed "
                            "(other work on this machine): the point is marked disturbed and left out of the knee; "
                            "delete its line from %s and rerun to measure it again", point.key,
                            100 * (point.contention or 0), cfg.out / "points.jsonl")
            sink.write(json.dumps(asdict(point)) + "\n")
            sink.flush()
            done[point.key] = point
            bar.update()
    bar.close()
    return [done[point_key(cfg.dataset, *g)] for g in cfg.grid]


def knee(points: list[Point], stall: float = KNEE_STALL) -> Point | None:
    """The point with the fewest host cores whose stall fraction is below `stall` (disturbed points left out)."""
    fed = [p for p in points if p.stall_fraction < stall and not p.disturbed]
    return min(fed, key=lambda p: (p.total_cores, p.hosts)) if fed else None


def per_core_rate(points: list[Point]) -> float | None:
    """Rows/s one host core supplies, from the host-bound points (stall above 10%), undisturbed ones. A
    point's cores are its CPU quota: CPU-seconds per second, so this is rows per CPU-second of quota."""
    bound = [p.rows_per_s / p.total_cores for p in points if p.stall_fraction > 0.10 and not p.disturbed]
    return sorted(bound)[len(bound) // 2] if bound else None


# ---- outputs ---------------------------------------------------------------------------------

_COLUMNS = [f.name for f in fields(Point) if f.name != "stage_seconds"]
TIME_TO_TRAIN_PLOT = "time_to_train.png"  # beside the sweep folders: every sweep under the same parent


def write_outputs(points: list[Point], out: Path) -> list[Path]:
    """sweep.parquet, sweep.csv, sweep.md and sweep.png in `out`; the paths written."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    stages = sorted({name for p in points for name in p.stage_seconds})
    columns = {name: [getattr(p, name) for p in points] for name in _COLUMNS}
    columns["cores_per_system"] = [p.cores_per_system for p in points]
    columns["time_to_train_h"] = [p.time_to_train_h for p in points]
    columns["disturbed"] = [p.disturbed for p in points]
    for name in stages:
        columns[f"stage_{name}_s"] = [p.stage_seconds.get(name, 0.0) for p in points]
    table = pa.table(columns)
    pq.write_table(table, out / "sweep.parquet")
    pacsv.write_csv(table, out / "sweep.csv")
    write_atomically(out / "sweep.md", markdown(points))
    plot(points, out / "sweep.png")
    both = plot_time_to_train(out.resolve().parent, out.resolve().parent / TIME_TO_TRAIN_PLOT)
    return [out / name for name in ("sweep.parquet", "sweep.csv", "sweep.md", "sweep.png")] + ([both] if both else [])


def markdown(points: list[Point]) -> str:
    k = knee(points)
    first = points[0]
    unit = "seq" if kind_of(first.dataset).text else "img"
    against = (f"{first.profile} x {first.scale:g} ({first.accel_rate:,.0f} {unit}/s when never waiting)"
               if first.accel_rate else "a real training step")
    named = "" if kind_of(first.dataset).text or first.transform_named == "train" else \
        f", transform {first.transform_named}"
    lines = [f"Sweep of {first.dataset}{named} against {against}", "",
             f"| hosts x cores x procs | host cores | cores {_per_system(first)} | {unit}/s | stall | "
             f"host CPU used (cores) | wire MB/s | time-to-train, full size |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        mark = " **knee**" if k is not None and p.key == k.key else ""
        if p.disturbed:
            mark += f" (disturbed: {100 * (p.contention or 0):.0f}% wait for a core)"
        lines.append(f"| {p.hosts} x {p.cores_per_host:g} x {p.procs}{mark} | {p.total_cores:g} | "
                     f"{p.cores_per_system:,.2f} | {p.rows_per_s:,.0f} | {100 * p.stall_fraction:.1f}% | "
                     f"{p.cores_used:.2f} | {p.wire_mb_per_s:.1f} | {p.time_to_train_h:.2f} h |")
    lines.append("")
    lines.append(f"Knee (fewest host cores with stall < {100 * KNEE_STALL:.0f}%): "
                 + (f"{k.total_cores:g} cores here, {k.cores_per_system:,.2f} {_per_system(k)}."
                    if k else "not reached on this grid."))
    disturbed = [p for p in points if p.disturbed]
    if disturbed:
        lines.append(f"{len(disturbed)} point(s) marked disturbed: their workers waited {100 * DISTURBED:.0f}% or "
                     "more of their runnable time for a core their quota allowed (other work on the machine took "
                     "it). They are left out of the knee and the per-core rate; remove their lines from "
                     "points.jsonl and rerun the sweep on a quieter host to measure them again.")
    return "\n".join(lines) + "\n"


def _per_system(point: Point) -> str:
    return f"per full {point.profile}" if point.accel_rate else "per accelerator"


def plot(points: list[Point], path: Path) -> None:
    """Delivered rate and stall fraction against host cores per accelerator, the knee marked."""
    from stoker.accel.optional import require

    require("matplotlib", "stoker sweep's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cores = sorted(points, key=lambda p: p.total_cores)
    x = [p.cores_per_system for p in by_cores]
    first = by_cores[0]
    unit = f"{kind_of(first.dataset).row_noun}/s"
    fig, (rate_ax, stall_ax, time_ax) = plt.subplots(1, 3, figsize=(14, 4))
    rate_ax.plot(x, [p.rows_per_s for p in by_cores], "o-", label="delivered")
    if first.accel_rate:
        rate_ax.axhline(first.accel_rate, color="grey", linestyle="--", label="accelerator rate")
    rate_ax.set_ylabel(f"{unit} (scaled x{first.scale:g})")
    stall_ax.plot(x, [100 * p.stall_fraction for p in by_cores], "o-", color="tab:red")
    stall_ax.axhline(100 * KNEE_STALL, color="grey", linestyle=":", label=f"{100 * KNEE_STALL:.0f}% stall")
    stall_ax.set_ylabel("accelerator stall (%)")
    time_ax.plot(x, [p.time_to_train_h for p in by_cores], "o-", color="tab:purple", label="projected")
    disturbed = [p for p in by_cores if p.disturbed]
    if disturbed:
        stall_ax.plot([p.cores_per_system for p in disturbed], [100 * p.stall_fraction for p in disturbed], "kx",
                      markersize=10, label="disturbed (left out)")
    time_ax.set_ylabel(f"time-to-train of the full {first.profile} (h)")
    k = knee(points)
    for ax in (rate_ax, stall_ax, time_ax):
        ax.set_xlabel(f"host cores {_per_system(first)}")
        if k is not None:
            ax.axvline(k.cores_per_system, color="tab:green", label=f"knee: {k.cores_per_system:,.2f} cores")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{first.dataset}: host CPU vs {first.profile} (measured on a {first.scale:g}x scale model)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def model_time_to_train_h(dataset: str, accel_rate: float, per_core: float, cores: float,
                          samples_per_row: float = 1.0) -> float:
    """stoker.planning's model: a full-size system consuming `accel_rate` rows/s when fed, given `cores`
    host cores of `per_core` rows/s each, trains in samples / (min(accel_rate, cores * per_core) x
    samples per row)."""
    delivered = min(accel_rate, cores * per_core) * samples_per_row
    return kind_of(dataset).workload.samples / max(delivered, 1e-9) / 3600


def plot_time_to_train(parent: Path, path: Path) -> Path | None:
    """One picture of every sweep folder under `parent`: time-to-train against host cores per full-size
    system, ResNet-50 (imagenet) and BERT (wikipedia) side by side, measured points and the model drawn
    from the sweep's per-core rate, the knee marked. None when no folder there holds points."""
    sweeps = sorted((points for folder in sorted(parent.iterdir()) if folder.is_dir()
                     for points in [load_points(folder)] if points), key=lambda ps: ps[0].dataset)
    if not sweeps:
        return None
    from stoker.accel.optional import require

    require("matplotlib", "stoker sweep's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({ps[0].dataset for ps in sweeps})
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for points in (ps for ps in sweeps if ps[0].dataset == dataset):
            _draw_sweep(ax, points)
        first = next(ps for ps in sweeps if ps[0].dataset == dataset)[0]
        model = kind_of(dataset).model_family
        ax.set_title(f"{model} on {dataset}, vs {first.profile}" if first.accel_rate else f"{model}, a real step")
        ax.set_xlabel(f"host cores {_per_system(first)}")
        ax.set_ylabel("time-to-train, full size (h)")
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Time-to-train against host cores per accelerator (measured at small scale, the scale undone)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw_sweep(ax, points: list[Point]) -> None:
    """One sweep's measured points, its model line and its knee on a time-to-train axis."""
    first = points[0]
    name = "" if kind_of(first.dataset).text or first.transform_named == "train" else f" ({first.transform_named})"
    kept = sorted((p for p in points if not p.disturbed), key=lambda p: p.cores_per_system)
    line = ax.plot([p.cores_per_system for p in kept], [p.time_to_train_h for p in kept], "o",
                   label=f"measured{name}")[0]
    gone = [p for p in points if p.disturbed]
    if gone:
        ax.plot([p.cores_per_system for p in gone], [p.time_to_train_h for p in gone], "x", color="black",
                label="disturbed (left out)")
    rate = per_core_rate(points)
    if rate and first.accel_rate:
        full = first.accel_rate / first.scale
        xs = sorted({p.cores_per_system for p in points} | {(1 - KNEE_STALL) * full / rate})
        grid = [xs[0] * (xs[-1] * 1.5 / xs[0]) ** (i / 60) for i in range(61)]
        ax.plot(grid, [model_time_to_train_h(first.dataset, full, rate, c, first.sequences_per_row) for c in grid],
                "-",
                color=line.get_color(), alpha=0.6, label=f"model: {rate:,.0f} per core{name}")
        knee_cores = (1 - KNEE_STALL) * full / rate
        ax.axvline(knee_cores, color=line.get_color(), linestyle=":",
                   label=f"model knee{name}: {knee_cores:.3g} cores ({100 * KNEE_STALL:.0f}% stall)")
    k = knee(points)
    if k is not None:
        ax.plot([k.cores_per_system], [k.time_to_train_h], "*", markersize=14, color=line.get_color(),
                label=f"first fed point{name}: {k.cores_per_system:.3g} cores")
