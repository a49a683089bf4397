"""`stoker plan --check`: run a plan's prediction in the lab and report how far it was off.

A plan says: at `r` samples per CPU-second, a device consuming `A` needs `K = (1 - s) A / r` host
cores to wait for data less than `s` of its time. The check makes that true at a size this
machine holds: one worker host in the lab with a CPU quota of exactly K cores (CPU-seconds per
second: the same clock as `r`), feeding a simulated device whose rate is set so the plan says K,
then the same with 0.8 K. The prediction holds when the stall is under the target at K and
over it at 0.8 K. At 0.8 K the host is the bottleneck, so what it delivered per core of quota is
the per-core rate the job really had, beside it the plan's: their ratio is the planner's error
(positive: the plan was optimistic and the job needs that much more CPU).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stoker.pipeline.kinds import kind_of
from stoker.sweep import Point, SweepConfig, measure_point

log = logging.getLogger("stoker.plan_check")

SHORT = 0.8  # the second point's share of the plan's cores
DEFAULT_CORES = {"imagenet": 1.0, "wikipedia": 0.5}  # K here: what a 2-core machine holds beside the consumer


@dataclass(frozen=True)
class CheckConfig:
    dataset: str
    per_core_rate: float  # the plan's: samples per CPU-second
    data: str  # manifest
    stall_target: float = 0.02
    cores: float | None = None  # K; None: DEFAULT_CORES for the dataset
    seconds: float = 20.0  # steady measurement per point
    samples_per_row: float = 1.0  # packed text: the sequences a row carries (the device steps rows)
    transform: str = "train"
    transform_params: str = ""
    train_args: tuple[str, ...] = ()  # more `stoker train` options (`--pack`)

    @property
    def k(self) -> float:
        return self.cores if self.cores is not None else DEFAULT_CORES[self.dataset]

    @property
    def device_rate(self) -> float:
        """Rows/s of the simulated device for which the plan says exactly K cores."""
        return self.k * self.per_core_rate / (1 - self.stall_target) / self.samples_per_row

    def predicted_stall(self, cores: float) -> float:
        return max(0.0, 1 - cores / self.k * (1 - self.stall_target))


@dataclass(frozen=True)
class CheckPoint:
    cores: float
    predicted_stall: float
    measured_stall: float
    samples_per_s: float
    per_core_rate: float  # samples per second per core of quota
    contention: float | None  # wait for a core beyond the quota's throttling (other work on this machine)


@dataclass
class CheckResult:
    dataset: str
    transform: str
    plan_rate: float
    stall_target: float
    device_rate: float  # rows/s
    points: list[CheckPoint] = field(default_factory=list)

    @property
    def at_k(self) -> CheckPoint:
        return self.points[0]

    @property
    def short(self) -> CheckPoint:
        return self.points[1]

    @property
    def holds(self) -> bool:
        return self.at_k.measured_stall < self.stall_target < self.short.measured_stall

    @property
    def planner_error(self) -> float:
        """The plan's per-core rate over the one measured where the host bounds the device, less 1."""
        return self.plan_rate / max(self.short.per_core_rate, 1e-9) - 1

    def as_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds, "planner_error": self.planner_error}


def run_check(cfg: CheckConfig, lab_state: Path | None = None) -> CheckResult:
    """The two lab points, K then 0.8 K."""
    result = CheckResult(dataset=cfg.dataset, transform=cfg.transform, plan_rate=cfg.per_core_rate,
                         stall_target=cfg.stall_target, device_rate=cfg.device_rate)
    sweep = SweepConfig(out=Path("unused"), dataset=cfg.dataset, seconds=cfg.seconds, rate=cfg.device_rate,
                        transform=cfg.transform, transform_params=cfg.transform_params, train_args=cfg.train_args,
                        need_quotas=True)
    for cores in (cfg.k, SHORT * cfg.k):
        point = measure_point(sweep, 1, cores, 1, cfg.data)
        result.points.append(_checked(cfg, point, cores))
        log.info("%g cores: stall %.1f%% (predicted %.1f%%)", cores, 100 * point.stall_fraction,
                 100 * cfg.predicted_stall(cores))
    return result


def _checked(cfg: CheckConfig, point: Point, cores: float) -> CheckPoint:
    samples = point.rows_per_s * point.sequences_per_row
    return CheckPoint(cores=cores, predicted_stall=cfg.predicted_stall(cores), measured_stall=point.stall_fraction,
                      samples_per_s=samples, per_core_rate=samples / cores, contention=point.contention)


def describe(result: CheckResult) -> str:
    text = kind_of(result.dataset).text
    unit = "sequences" if text else "images"
    named = "" if text else f" ({result.transform})"
    lines = [f"check of {result.dataset}{named}: the plan's {result.plan_rate:,.0f} {unit} per CPU-second says "
             f"{result.at_k.cores:g} core(s) hold the stall under {100 * result.stall_target:.0f}% of a device "
             f"stepping {result.device_rate:,.0f} rows/s; one lab host with that CPU quota, then {SHORT:.0%} of it:"]
    for p in result.points:
        disturbed = (f"; waited {100 * p.contention:.0f}% of the time for a core the quota allowed (other work)"
                     if p.contention is not None and p.contention >= 0.01 else "")
        lines.append(f"  {p.cores:g} cores: stall {100 * p.measured_stall:.1f}% measured, "
                     f"{100 * p.predicted_stall:.1f}% predicted; {p.samples_per_s:,.0f} {unit}/s, "
                     f"{p.per_core_rate:,.0f} per core of quota{disturbed}")
    verdict = "holds" if result.holds else "does not hold"
    lines.append(f"the prediction {verdict} (it holds with the stall under the target at {result.at_k.cores:g} "
                 f"core(s) and over it at {result.short.cores:g})")
    lines.append(f"planner error {100 * result.planner_error:+.1f}%: the plan's per-core rate over the one the job "
                 f"had where the host bounded it"
                 + ("; positive: the job needs that much more CPU than planned" if result.planner_error > 0 else ""))
    return "\n".join(lines)
