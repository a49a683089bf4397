"""`stoker plan`: host cores, time-to-train and performance per dollar for an accelerator system.

The model is the one a sweep measures: a system consumes `A` samples/s when never waiting;
host cores supply `r` samples/s each; the system runs at min(A, c * r) and stalls for the
rest, so its stall fraction is 1 - c * r / A below the knee. Cores for a stall target `s`:
c = ceil((1 - s) * A / r). Hosts: the cores a system does not bring itself, in servers of
`cores_per_host`. Time-to-train: the samples to converge over the delivered rate. Price:
the system plus its extra hosts; performance per dollar: delivered samples/s per dollar.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from stoker.accel.backends.profiles import PROFILES, profile_rate
from stoker.accel.cost import rate_figure
from stoker.pipeline.kinds import kind_of
from stoker.pipeline.transforms import parse_params
from stoker.protos.errors import ConfigError


@dataclass(frozen=True)
class System:
    name: str
    profile: str  # accel.backends.profiles name of one accelerator in it
    count: int  # accelerators of that profile in the system
    price: float | None  # US dollars; None: give --accel-price
    host_cores: int  # host CPU cores the system brings (a DGX has its own CPUs)
    source: str


SYSTEMS = {s.name: s for s in (
    System("ipu-pod16", "ipu-pod16", 1, 149_995, 0,
           "Graphcore IPU-POD16 list price $149,995 (quoted in the planning issue); host server(s) priced separately"),
    System("ipu-pod64", "ipu-pod64", 1, None, 0, "Graphcore IPU-POD64; give --accel-price"),
    System("dgx-a100", "a100", 8, 300_000, 128,
           "NVIDIA DGX A100: ~$300,000 (quoted in the planning issue), 8 A100s and 2 x 64-core AMD EPYC 7742"),
    System("a100", "a100", 1, None, 0, "one A100; give --accel-price"),
    System("h100", "h100", 1, None, 0, "one H100 SXM; give --accel-price"),
    System("h200", "h200", 1, None, 0, "one H200; give --accel-price"),
    System("b200", "b200", 1, None, 0, "one B200; give --accel-price"),
)}

# An assumption, not a quote: a dual-socket x86 server with 64 cores and no accelerators.
DEFAULT_HOST_PRICE = 25_000.0
DEFAULT_CORES_PER_HOST = 64


def transform_key(name: str, params: str = "") -> str:
    """How a per-core rate's transform is named (calibration files, sweeps, plans): the name as
    `--transform` takes it, and its parameters as canonical JSON, if any."""
    params = parse_params(params)
    return f"{name} {params}" if params else name


@dataclass(frozen=True)
class PlanInput:
    system: str
    dataset: str
    per_core_rate: float  # samples/s one host core supplies (stoker calibrate or a sweep)
    stall_target: float = 0.02
    cores_per_host: int = DEFAULT_CORES_PER_HOST
    host_price: float = DEFAULT_HOST_PRICE
    accel_price: float | None = None  # overrides the system's price
    samples: float | None = None  # overrides the workload's samples to train
    transform: str = ""  # the image transform whose rate this is (transform_key), "" unnamed


@dataclass(frozen=True)
class Plan:
    system: str
    dataset: str
    accel_rate: float  # samples/s the system consumes when never waiting
    per_core_rate: float
    cores_needed: int  # for a stall below the target
    extra_hosts: int  # servers beyond the system's own cores
    delivered_rate: float
    stall_fraction: float
    time_to_train_h: float
    price: float | None  # system + extra hosts
    host_cost: float
    samples_per_s_per_kdollar: float | None  # performance per dollar (x1,000)
    transform: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def make_plan(inp: PlanInput) -> Plan:
    if inp.per_core_rate <= 0:
        raise ConfigError("the per-core rate must be positive (measure it with `stoker calibrate` or a sweep)")
    if not 0 <= inp.stall_target < 1:
        raise ConfigError(f"stall target {inp.stall_target} must lie in [0, 1)")
    if inp.system not in SYSTEMS:
        raise ConfigError(f"unknown system {inp.system!r} (choose {', '.join(SYSTEMS)})")
    system = SYSTEMS[inp.system]
    accel_rate = profile_rate(system.profile, inp.dataset) * system.count
    cores = math.ceil((1 - inp.stall_target) * accel_rate / inp.per_core_rate - 1e-9)
    extra_hosts = math.ceil(max(0, cores - system.host_cores) / inp.cores_per_host)
    delivered = min(accel_rate, cores * inp.per_core_rate)
    samples = inp.samples or kind_of(inp.dataset).workload.samples
    accel_price = inp.accel_price if inp.accel_price is not None else system.price
    price = None if accel_price is None else accel_price + extra_hosts * inp.host_price
    return Plan(system=system.name, dataset=inp.dataset, accel_rate=accel_rate, per_core_rate=inp.per_core_rate,
                cores_needed=cores, extra_hosts=extra_hosts, delivered_rate=delivered,
                stall_fraction=1 - delivered / accel_rate, time_to_train_h=samples / delivered / 3600,
                price=price, host_cost=extra_hosts * inp.host_price,
                samples_per_s_per_kdollar=None if price is None else 1000 * delivered / price, transform=inp.transform)


def decode_note(system: str) -> str:
    """What moving JPEG decode to the system's accelerators would change for the host (accel.backends.profiles)."""
    return PROFILES[SYSTEMS[system].profile].decode_on_accelerator


def describe(plan: Plan) -> str:
    unit = kind_of(plan.dataset).row_noun
    price = f"${plan.price:,.0f}" if plan.price is not None else "no price (give --accel-price)"
    per_k = plan.samples_per_s_per_kdollar
    ppd = "-" if per_k is None else f"{per_k:,.2f}" if per_k >= 0.01 else f"{per_k:.2g}"
    ppd += f" {unit}/s per $1,000" if per_k is not None else ""
    named = f" (transform {plan.transform})" if plan.transform and plan.transform != "train" else ""
    return (f"{plan.system} / {plan.dataset}{named}: {plan.accel_rate:,.0f} {unit}/s when fed; "
            f"{plan.cores_needed:,} host core(s) at {rate_figure(plan.per_core_rate)} {unit}/s per core "
            f"(+{plan.extra_hosts:,} host server(s)) for stall {100 * plan.stall_fraction:.1f}%; "
            f"time-to-train {plan.time_to_train_h:.2f} h; {price}; {ppd}")


def compare(plans: list[Plan]) -> str:
    """Performance per dollar relative to the last plan, and where the model and the published figures part."""
    base = plans[-1]
    lines = []
    for plan in plans[:-1]:
        if plan.samples_per_s_per_kdollar is None or base.samples_per_s_per_kdollar is None:
            lines.append(f"{plan.system} vs {base.system}: needs prices for both")
            continue
        ratio = plan.samples_per_s_per_kdollar / base.samples_per_s_per_kdollar
        lines.append(f"{plan.dataset}: {plan.system} gives {ratio:.2f}x the performance per dollar of {base.system}")
        published = kind_of(plan.dataset).pod16_over_dgx
        if (plan.system, base.system) == ("ipu-pod16", "dgx-a100") and published:
            pod, dgx = SYSTEMS["ipu-pod16"].price or 1, SYSTEMS["dgx-a100"].price or 1
            implied = plan.accel_rate * dgx / (published * pod)  # at list prices, hosts not counted
            lines.append(f"  published (Graphcore): {published}x. Their ratio implies the DGX A100 at "
                         f"{implied:,.0f} samples/s, where this model uses {base.accel_rate:,.0f} "
                         f"({SYSTEMS['dgx-a100'].count} x the a100 profile); this model also adds the POD16's "
                         f"{plan.extra_hosts} host server(s) (${plan.host_cost:,.0f}) "
                         f"and gives the DGX no host cost (its 128 cores are inside its price).")
    return "\n".join(lines)
