"""A job's seat in a fleet: the options of the commands that run a job's dispatcher (--fleet, --weight,
--min-cores, ...), as one value with its one check, and its form on the wire (the job's registration,
`pb.FleetJob`). The job's side of the fleet, so the control plane holds it; the fleet (stoker.accel.fleet)
reads the limits and the registrations from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import KEY_NAME
from stoker.protos.endpoints import peer_endpoint_problem
from stoker.protos.errors import ConfigError

MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6  # weights are relative: beyond these they only overflow a share
MOST_CORES = 1e6  # a job asking more cores than this asks for nothing any fleet holds: refused


class SeatError(ConfigError):
    """A fleet seat that cannot work: `field` names the seat's field the message starts with (the command
    line says it as that field's flag: `configured.as_flag_problem(FleetSeat, ...)`)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"FleetSeat: {message}")
        self.field = name


@dataclass(frozen=True)
class FleetSeat:
    """A job's seat in a fleet, as ConsumerConfig and DispatchConfig hold it (their `seat`): the fleet's
    endpoint (None: the job's own workers, no fleet) and what the job asks of it. Checked once, as it is made."""

    fleet: str | None = field(default=None, metadata={
        "help": "register the job with this fleet (stoker fleet), e.g. tcp://10.0.0.5:5570: its hosts serve the job, "
                "with processes moved in and out as its demand and its weight say", "metavar": "ENDPOINT",
        "check": "peer-endpoint"})
    weight: float = field(default=1.0, metadata={
        "help": "with --fleet: the job's weight when the fleet is short (default %(default)s)", "check": "above-zero"})
    min_cores: int = field(default=0, metadata={
        "help": "with --fleet: the CPU cores the job is given first, as worker processes at the fleet's cores "
                "per process (one a core where hosts give a core a process; default %(default)s)",
        "check": "non-negative"})
    max_cores: int | None = field(default=None, metadata={
        "help": "with --fleet: the most CPU cores the job is given, as worker processes at the fleet's cores per "
                "process (one a core where hosts give a core a process; default: no limit)", "check": "positive"})
    key_name: str = field(default="job", metadata={
        "help": "with --fleet and --keys: the job's key (stoker keys add DIR NAME --role job; default %(default)s)",
        "flag": "--fleet-key-name", "dest": "fleet_key_name"})
    start_cores: float | None = field(default=None, metadata={
        "help": "with --fleet: the CPU cores to ask for before the job has measured its need (default: the "
                "planner's estimate, where `stoker calibrate` measured the job's rate and the device's rate is known; "
                "else a small start and the processes no other job wants)", "check": "above-zero",
        "flag": "--fleet-start-cores",
        "dest": "fleet_start_cores"})

    def __post_init__(self) -> None:
        """The one check of a job's fleet options, wherever they are made (a flag, a script's config)."""
        found = self.problem()
        if found:
            raise SeatError(*found)

    def problem(self) -> tuple[str, str] | None:
        """The field that cannot work and why, its message starting with the field (None: all can)."""
        weight, min_cores, max_cores, start = self.weight, self.min_cores, self.max_cores, self.start_cores
        why = None if self.fleet is None else peer_endpoint_problem(self.fleet)
        if why:
            return "fleet", f"fleet {why}"
        if start is not None and (isinstance(start, bool) or not isinstance(start, int | float)
                                  or not 0 < start <= MOST_CORES):
            return "start_cores", f"start_cores must be a number above 0 and at most {MOST_CORES:.0e}, not {start!r}"
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            return "weight", f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, not {weight!r}"
        if isinstance(min_cores, bool) or not isinstance(min_cores, int) or not 0 <= min_cores <= MOST_CORES:
            return "min_cores", f"min_cores must be an integer from 0 to {MOST_CORES:.0e}, not {min_cores!r}"
        if max_cores is not None and (isinstance(max_cores, bool) or not isinstance(max_cores, int)
                                      or not max(min_cores, 1) <= max_cores <= MOST_CORES):
            return "max_cores", (f"max_cores must be an integer of at least min_cores ({min_cores}) and 1, and at "
                                 f"most {MOST_CORES:.0e}, not {max_cores!r}")
        if not isinstance(self.key_name, str) or not KEY_NAME.fullmatch(self.key_name):
            return "key_name", f"key_name must be a key's name (letters, digits, - and _), not {self.key_name!r}"
        if self.fleet is None and (weight != 1.0 or min_cores or max_cores is not None or start is not None):
            return "fleet", ("fleet: min_cores, max_cores, start_cores and a weight other than 1 are a job's ask, and "
                             "no endpoint was given to ask (--fleet ENDPOINT)")
        return None

    def registration(self, job_id: str, dispatcher: str, transform: str = "", leaving: bool = False) -> pb.FleetJob:
        """The job's registration as the fleet hears it (its beat adds what the job measures): who it is, where
        its dispatcher is and what it is worth. Leaving, only who it is."""
        if leaving:
            return pb.FleetJob(job_id=job_id, endpoint=dispatcher, weight=self.weight, leaving=True)
        message = pb.FleetJob(job_id=job_id, endpoint=dispatcher, weight=self.weight, min_cores=self.min_cores,
                              transform=transform)
        if self.max_cores is not None:
            message.max_cores = self.max_cores
        return message


def asked_of(registration: pb.FleetJob) -> tuple[float, int, int | None]:
    """What a registration asks of the fleet as the wire holds it: the weight, the min and the max cores (None:
    no limit). Not checked here: the fleet refuses what its policy cannot hold (accel.fleet.allocation)."""
    return (registration.weight, registration.min_cores,
            registration.max_cores if registration.HasField("max_cores") else None)
