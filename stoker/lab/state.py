"""What a lab is made of, and where that is written: its names on this machine, its config, its members
and the state file that `stoker lab down` removes everything by (also after a crash)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stoker.pipeline.store.files import write_atomically

DATA_PORT, CONTROL_PORT, METRICS_PORT, WORKER_METRICS_PORT = 5560, 5561, 9560, 9561
RANK_METRICS_PORT = 9570  # + rank, for ranks 1.. (clear of the workers' ports on loopback)
FLEET_PORT, FLEET_METRICS_PORT = 5570, 9558  # with --fleet


def state_dir() -> Path:
    if os.environ.get("STOKER_LAB_DIR"):
        return Path(os.environ["STOKER_LAB_DIR"])
    return Path("/run/stoker-lab") if os.geteuid() == 0 else Path.home() / ".cache" / "stoker" / "lab"


@dataclass(frozen=True)
class Names:
    """What one lab calls what it makes on the machine: its namespaces, links, subnet and cgroup. The
    default lab (no $STOKER_LAB_DIR) has the documented ones (stk-h0, stkbr0, 198.18.0.0/24, stoker-lab);
    a lab with a state folder of its own (each test's) has its own, tagged, so two labs on one machine
    never touch each other's, and `down` removes only its own."""

    tag: str = ""

    @property
    def prefix(self) -> str:
        return f"stk{self.tag}-"

    @property
    def bridge(self) -> str:
        return f"stkbr{self.tag or 0}"

    def veth(self, member: str) -> str:
        return f"stkv{self.tag}-{member}"  # at most 15 characters: a tag of 4, a member name of 5

    @property
    def cgroup(self) -> str:
        return "stoker-lab" + (f"-{self.tag}" if self.tag else "")

    def address(self, last: int) -> str:
        """In 198.18.0.0/24 for the default lab, else a /24 of 198.18.2-201 picked by the tag."""
        return f"198.18.{2 + int(self.tag, 16) % 200 if self.tag else 0}.{last}"

    @property
    def accel_address(self) -> str:
        return self.address(1)

    @property
    def bridge_address(self) -> str:
        return self.address(254)

    def host_address(self, index: int) -> str:
        return self.address(10 + index)


def names() -> Names:
    """This lab's names: tagged by its state folder when $STOKER_LAB_DIR gives one."""
    folder = os.environ.get("STOKER_LAB_DIR")
    return Names(hashlib.sha256(folder.encode()).hexdigest()[:4] if folder else "")


@dataclass
class LabConfig:
    hosts: int = 3
    cores_per_host: float = 1.0
    procs: int = 1  # worker processes per host
    link_gbit: float | None = None
    link_latency_ms: float | None = None
    loopback: bool = False  # force the fallback even where namespaces work
    ranks: int = 1  # consumer ranks (data-parallel), all in the accelerator's namespace
    fleet: bool = False  # a `stoker fleet` in the accelerator's namespace instead of a consumer; jobs come later


@dataclass
class Member:
    name: str  # "accel" or "h0", "h1", ...
    address: str
    netns: str | None
    pid: int | None = None
    log: str = ""
    metrics: str = ""  # URL of its /metrics


@dataclass
class LabState:
    mode: str  # "netns" or "loopback"
    config: dict
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # in the root namespace
    cgroups: list[str] = field(default_factory=list)
    members: dict[str, Member] = field(default_factory=dict)
    summary: str = ""  # where the consumer writes its closing summary
    note: str = ""

    def save(self) -> None:
        folder = state_dir()
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / "state.json", json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls) -> LabState | None:
        path = state_dir() / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["members"] = {k: Member(**v) for k, v in data["members"].items()}
        return cls(**data)

    @property
    def consumer(self) -> Member:
        return self.members["accel"]

    @property
    def control_endpoint(self) -> str:
        return f"tcp://{self.consumer.address}:{CONTROL_PORT}"

    @property
    def fleet_endpoint(self) -> str:
        """With `--fleet`: where hosts and jobs register (the accelerator's namespace runs the fleet)."""
        return f"tcp://{self.consumer.address}:{FLEET_PORT}"
