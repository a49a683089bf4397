"""`stoker lab up --fleet`: the emulated cluster shared by many jobs.

The accelerator's namespace runs `stoker fleet` instead of a consumer; each host's daemon serves
the fleet (`stoker worker --fleet`); jobs come later, each a `stoker train --fleet` in the
accelerator's namespace with ports of its own and a job key of its own (`stoker lab job NAME --
TRAIN OPTIONS`), so one lab shows how the fleet shares its hosts between them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stoker.lab.cluster import (
    FLEET_METRICS_PORT,
    FLEET_PORT,
    Lab,
    LabConfig,
    LabState,
    Member,
    _spawn,
    _tail,
    alive,
    current,
    state_dir,
    wait_for_metrics,
)
from stoker.lab.system import LabError
from stoker.protos.curve import add_key

JOB_KEYS = 8  # job0 .. job7: the jobs a lab can run at once
JOB_DATA_PORT, JOB_METRICS_PORT = 5600, 9600  # job k: data 5600 + 2k, control 5601 + 2k, metrics 9600 + k


class FleetLab(Lab):
    """A lab whose accelerator namespace runs the fleet; its hosts serve the fleet."""

    def __init__(self, cfg: LabConfig) -> None:
        if not cfg.fleet or cfg.ranks != 1:
            raise LabError("a fleet's lab has no ranks of its own: its jobs come later (stoker lab job)")
        super().__init__(cfg)

    def _more_keys(self, folder: Path) -> None:
        for index in range(JOB_KEYS):
            add_key(folder, f"job{index}", role="job")

    def _start_head(self, state: LabState, train_args: list[str]) -> None:
        start_fleet(state)


def start_fleet(state: LabState) -> Member:
    """The fleet in the accelerator's namespace (again, after it was killed: on the same address)."""
    from stoker.lab.cluster import names

    netns = state.mode == "netns"
    address = names().accel_address if netns else "127.0.0.1"
    member = Member("accel", address, f"{names().prefix}accel" if netns else None,
                    log=str(state_dir() / "fleet.log"), metrics=f"http://{address}:{FLEET_METRICS_PORT}/metrics")
    cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "fleet", "--bind", f"tcp://{address}:{FLEET_PORT}",
           "--metrics-addr", address, "--metrics-port", str(FLEET_METRICS_PORT), "--keys", str(state_dir() / "keys")]
    member.pid = _spawn(cmd, member.netns, None, Path(member.log))
    state.members["accel"] = member
    state.save()
    wait_for_metrics(member, "the fleet")
    return member


def start_job(name: str, train_args: list[str]) -> Member:
    """A job registered with the lab's fleet: `name` is job0 .. job7 (its key and its ports)."""
    state = current()
    if not state.config.get("fleet"):
        raise LabError("this lab runs one job's consumer; start one with `stoker lab up --fleet` for jobs")
    index = _job_index(name)
    if name in state.members and alive(state.members[name].pid):
        raise LabError(f"job {name} is running already")
    address = state.consumer.address
    member = Member(name, address, state.consumer.netns, log=str(state_dir() / f"{name}.log"),
                    metrics=f"http://{address}:{JOB_METRICS_PORT + index}/metrics")
    cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "train", "--no-progress",
           "--data-bind", f"tcp://{address}:{JOB_DATA_PORT + 2 * index}",
           "--control-bind", f"tcp://{address}:{JOB_DATA_PORT + 2 * index + 1}",
           "--metrics-addr", address, "--metrics-port", str(JOB_METRICS_PORT + index),
           "--keys", str(state_dir() / "keys"), "--fleet", state.fleet_endpoint, "--fleet-key-name", name,
           "--json", job_summary_path(name), *train_args]
    Path(job_summary_path(name)).unlink(missing_ok=True)
    member.pid = _spawn(cmd, member.netns, None, Path(member.log))
    state.members[name] = member
    state.save()
    return member


def job_summary_path(name: str) -> str:
    return str(state_dir() / f"summary-{name}.json")


def job_summary(name: str, timeout_s: float | None = None) -> dict:
    """Wait for job `name` to end; its closing summary."""
    member = current().members.get(name)
    if member is None:
        raise LabError(f"no job {name} in this lab")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while alive(member.pid):
        if deadline is not None and time.monotonic() > deadline:
            raise LabError(f"job {name} is still running after {timeout_s:.0f} s")
        time.sleep(0.2)
    path = Path(job_summary_path(name))
    if not path.exists():
        raise LabError(f"job {name} exited without a summary; its log:\n{_tail(member.log)}")
    return json.loads(path.read_text())


def _job_index(name: str) -> int:
    if not (name.startswith("job") and name[3:].isdigit() and int(name[3:]) < JOB_KEYS):
        raise LabError(f"a lab job is named job0 .. job{JOB_KEYS - 1} (its key and its ports), not {name!r}")
    return int(name[3:])
