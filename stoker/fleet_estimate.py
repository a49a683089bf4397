"""Where a job joining a fleet starts: the planner's estimate of its cores, before it has measured any.

The estimate is the planner's arithmetic on two rates this machine knows: the device's (a simulated
accelerator's --rate, or its --profile's rate times --scale) and one core's (the job's dataset or
transform in `stoker calibrate`'s file). Where either is unknown there is no estimate, and the job
asks for its fair share until its device has stepped (accel.control.fleet_member.DemandMeter)."""

from __future__ import annotations

import logging
from pathlib import Path

from stoker.accel.backends.accelerators import AccelSpec
from stoker.accel.control.fleet_member import HEADROOM
from stoker.calibrate import checked_rate, load, transform_rate
from stoker.protos.errors import ConfigError

log = logging.getLogger("stoker.fleet")


def start_cores(spec: AccelSpec, dataset: str, transform: str, params: str, ranks: int, pack: bool,
                calibration: Path) -> float | None:
    """CPU cores to ask for at first; None where the device's or a core's rate is unknown."""
    device = _device_rate(spec, dataset)
    if device is None or not calibration.exists():
        return None
    try:
        data = load(calibration)
        name = transform if dataset == "imagenet" else "wikipedia_packed" if pack else "wikipedia"
        entry = transform_rate(data, transform, params, str(calibration)) if dataset == "imagenet" else data.get(name)
        if entry is None:
            return None
        per_core = checked_rate(entry, name, str(calibration))
    except ConfigError as exc:
        log.warning("no start estimate for the fleet: %s", exc)
        return None
    cores = device * ranks / per_core
    log.info("fleet start estimate: %.0f samples/s per rank x %d ranks / %.0f per core (%s) = %.2f cores, +%.0f%%",
             device, ranks, per_core, calibration, cores, 100 * (HEADROOM - 1))
    return cores * HEADROOM


def _device_rate(spec: AccelSpec, dataset: str) -> float | None:
    if spec.kind != "simulated":
        return None
    if spec.profile:
        from stoker.accel.backends.profiles import profile_rate

        return profile_rate(spec.profile, dataset, spec.scale)
    return spec.rate
