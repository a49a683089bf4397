"""A job's seat in a fleet: the options of the commands that run a job's dispatcher (--fleet, --weight,
--min-cores, ...), their limits and their one check. The job's side of the fleet, so the control plane
holds it; the fleet (stoker.accel.fleet) reads the limits from here."""

from __future__ import annotations

from dataclasses import field
from typing import Any

MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6  # weights are relative: beyond these they only overflow a share
MOST_CORES = 1e6  # a job asking more cores than this asks for nothing any fleet holds: refused


# ---- a job's seat in a fleet: options of the commands that run a job's dispatcher ---------------

def fleet_endpoint() -> Any:
    return field(default=None, metadata={
        "help": "register the job with this fleet (stoker fleet), e.g. tcp://10.0.0.5:5570: its hosts serve the job, "
                "with processes moved in and out as its demand and its weight say", "metavar": "ENDPOINT",
        "check": "endpoint"})


def fleet_weight() -> Any:
    return field(default=1.0, metadata={
        "help": "with --fleet: the job's weight when the fleet is short (default %(default)s)", "check": "above-zero"})


def fleet_min_cores() -> Any:
    return field(default=0, metadata={
        "help": "with --fleet: worker processes (one core each) the job is given first (default %(default)s)",
        "check": "non-negative"})


def fleet_max_cores() -> Any:
    return field(default=None, metadata={
        "help": "with --fleet: the most worker processes the job is given (default: no limit)",
        "check": "positive"})


def fleet_key_name() -> Any:
    return field(default="job", metadata={
        "help": "with --fleet and --keys: the job's key (stoker keys add DIR NAME --role job; default %(default)s)"})


def fleet_start_cores() -> Any:
    return field(default=None, metadata={
        "help": "with --fleet: the CPU cores to ask for before the job has measured its need (default: the "
                "planner's estimate, where `stoker calibrate` measured the job's rate and the device's rate is known; "
                "else its fair share)", "check": "above-zero"})


def fleet_problem(fleet: str | None, weight: float, min_cores: int, max_cores: int | None,
                  start_cores: float | None = None) -> str | None:
    """What cannot work in a job's fleet options (None: all can): said at parse time and in a config."""
    if start_cores is not None and not 0 < start_cores <= MOST_CORES:
        return f"fleet_start_cores must be a number above 0 and at most {MOST_CORES:.0e}, not {start_cores!r}"
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        return f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, not {weight!r}"
    if isinstance(min_cores, bool) or not isinstance(min_cores, int) or min_cores < 0:
        return f"min_cores must be an integer of at least 0, not {min_cores!r}"
    if max_cores is not None and (isinstance(max_cores, bool) or not isinstance(max_cores, int)
                                  or max_cores < max(min_cores, 1)):
        return f"max_cores must be an integer of at least min_cores ({min_cores}) and 1, not {max_cores!r}"
    if fleet is None and (weight != 1.0 or min_cores or max_cores is not None or start_cores is not None):
        return ("weight, min_cores, max_cores and fleet_start_cores are a job's ask of a fleet: give the fleet too "
                "(--fleet ENDPOINT)")
    return None
