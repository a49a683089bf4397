"""The emulated cluster: one network namespace per host, veths into a bridge, CPU quotas, shaping.

Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range): the bridge in the root
namespace is 198.18.0.254, the accelerator namespace 198.18.0.1, host i 198.18.0.(10 + i).
Each host's `stoker worker` daemon runs inside its namespace and a CPU cgroup with
`cores_per_host` CPUs of quota; the consumer (+ dispatcher) runs in the accelerator
namespace. Every link uses CURVE with keys made for the lab (the consumer admits exactly
its hosts). Everything made is written to a state file as soon as it exists, so `down`
removes it all, also after a crash, and running `down` twice is harmless. Without root or
without namespaces the lab falls back to loopback addresses and says so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from stoker.accel.consumer_config import ConsumerConfig
from stoker.configured import command_line
from stoker.lab.job_flags import step_options
from stoker.lab.processes import (
    _kill,
    _member,
    _signal_group,
    _spawn,
    _tail,
    alive,
    hosts_cpu_seconds,
    wait_for_metrics,
)
from stoker.lab.state import (
    CONTROL_PORT,
    DATA_PORT,
    FLEET_METRICS_PORT,
    FLEET_PORT,
    METRICS_PORT,
    RANK_METRICS_PORT,
    WORKER_METRICS_PORT,
    LabConfig,
    LabState,
    Member,
    Names,
    names,
    state_dir,
)
from stoker.lab.system import (
    LabError,
    can_use_namespaces,
    cgroup_pids,
    cpu_cgroup_dir,
    link_exists,
    make_cpu_cgroup,
    netns_list,
    remove_cgroup_tree,
    run,
)
from stoker.protos.curve import add_key, init_keys
from stoker.workers.worker_config import WorkerConfig

log = logging.getLogger("stoker.lab")

__all__ = [  # what the lab's users (stoker.lab.fleet_lab, `stoker lab`, sweeps, benchmarks) reach through this module
    "CONTROL_PORT", "DATA_PORT", "FLEET_METRICS_PORT", "FLEET_PORT", "METRICS_PORT", "RANK_METRICS_PORT",
    "WORKER_METRICS_PORT", "Lab", "LabConfig", "LabError", "LabState", "Member", "Names", "_kill", "_spawn", "_tail",
    "alive", "current", "cut", "down", "heal", "hosts_cpu_seconds", "kill_host", "names", "rank_summary",
    "shape_link", "state_dir", "wait", "wait_for_metrics"]


class Lab:
    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg

    # ---- up ---------------------------------------------------------------------------------
    def up(self, train_args: list[str]) -> LabState:
        """Build the cluster and start the consumer and one worker daemon per host."""
        if LabState.load() is not None:
            raise LabError(f"a lab is already up (state in {state_dir()}); run `stoker lab down` first")
        why_not = "forced by --loopback" if self.cfg.loopback else can_use_namespaces()
        mode = "netns" if why_not is None else "loopback"
        state = LabState(mode=mode, config=asdict(self.cfg),
                         note="" if why_not is None else f"no network namespaces ({why_not}): loopback addresses")
        state.summary = str(state_dir() / "summary.json")
        state.save()
        try:
            self._keys()
            if mode == "netns":
                self._network(state)
            self._cgroups(state)
            self._start_head(state, train_args)
            for index in range(self.cfg.hosts):
                self._start_worker(state, index)
        except BaseException:
            down()
            raise
        return state

    def _keys(self) -> None:
        """Fresh CURVE keys for this lab: the consumer admits exactly its hosts."""
        folder = state_dir() / "keys"
        if folder.exists():
            shutil.rmtree(folder)
        init_keys(folder)
        for index in range(self.cfg.hosts):
            add_key(folder, f"h{index}")
        for rank in range(1, self.cfg.ranks):  # they attach to rank 0's dispatcher as consumers
            add_key(folder, f"rank{rank}", role="consumer")
        self._more_keys(folder)

    def _more_keys(self, folder: Path) -> None:
        """Keys beyond the hosts' and the ranks' (a fleet's lab adds its jobs')."""

    def _start_head(self, state: LabState, train_args: list[str]) -> None:
        """What the accelerator's namespace runs: the job's consumer (a fleet's lab runs the fleet)."""
        self._start_consumer(state, train_args)

    def _network(self, state: LabState) -> None:
        lab = names()
        run("ip", "link", "add", lab.bridge, "type", "bridge")
        state.links.append(lab.bridge)
        state.save()
        run("ip", "addr", "add", f"{lab.bridge_address}/24", "dev", lab.bridge)
        run("ip", "link", "set", lab.bridge, "up")
        members = [("accel", lab.accel_address)] + [(f"h{i}", lab.host_address(i)) for i in range(self.cfg.hosts)]
        for name, address in members:
            ns, veth = f"{lab.prefix}{name}", lab.veth(name)
            run("ip", "netns", "add", ns)
            state.netns.append(ns)
            state.save()
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            state.links.append(veth)
            state.save()
            run("ip", "link", "set", veth, "master", lab.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            if name != "accel":
                shape_link(ns, self.cfg.link_gbit, self.cfg.link_latency_ms)

    def _cgroups(self, state: LabState) -> None:
        root = cpu_cgroup_dir(names().cgroup)
        if root is None or os.geteuid() != 0:
            state.note += "; no CPU quotas (no writable cgroup filesystem)"
            return
        state.cgroups.append(str(root))
        state.save()
        for index in range(self.cfg.hosts):
            make_cpu_cgroup(root / f"h{index}", self.cfg.cores_per_host)

    def _start_consumer(self, state: LabState, train_args: list[str]) -> None:
        netns = state.mode == "netns"
        address = names().accel_address if netns else "127.0.0.1"
        member = Member("accel", address, f"{names().prefix}accel" if netns else None,
                        log=str(state_dir() / "accel.log"), metrics=f"http://{address}:{METRICS_PORT}/metrics")
        ranks = ["--world-size", str(self.cfg.ranks)] if self.cfg.ranks > 1 else []
        consumer = ConsumerConfig(data_bind=f"tcp://{address}:{DATA_PORT}", metrics_addr=address,
                                  control_bind=f"tcp://{address}:{CONTROL_PORT}", keys=str(state_dir() / "keys"))
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "train", "--no-progress",
               f"--metrics-port={METRICS_PORT}", "--json", state.summary, *command_line(consumer), *ranks,
               *train_args]
        member.pid = _spawn(cmd, member.netns, None, Path(member.log))
        state.members["accel"] = member
        state.save()
        for rank in range(1, self.cfg.ranks):
            self._start_rank(state, rank, address, step_options(train_args))
        wait_for_metrics(member, "the consumer")

    def _start_rank(self, state: LabState, rank: int, address: str, step_options: list[str]) -> None:
        """Rank r: a consumer in the accelerator's namespace, attached to rank 0's dispatcher."""
        name = f"accel{rank}"
        member = Member(name, address, state.consumer.netns, log=str(state_dir() / f"{name}.log"),
                        metrics=f"http://{address}:{RANK_METRICS_PORT + rank}/metrics")
        consumer = ConsumerConfig(dispatcher=state.control_endpoint, data_bind=f"tcp://{address}:0",
                                  advertise_host=address, metrics_addr=address, keys=str(state_dir() / "keys"),
                                  key_name=f"rank{rank}")
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "train", "--no-progress", "--rank", str(rank),
               "--world-size", str(self.cfg.ranks), f"--metrics-port={RANK_METRICS_PORT + rank}",
               "--json", rank_summary(state, rank), *command_line(consumer), *step_options]
        member.pid = _spawn(cmd, member.netns, None, Path(member.log))
        state.members[name] = member
        state.save()

    def _start_worker(self, state: LabState, index: int) -> None:
        netns = state.mode == "netns"
        name = f"h{index}"
        address = names().host_address(index) if netns else "127.0.0.1"
        port = WORKER_METRICS_PORT if netns else WORKER_METRICS_PORT + index
        member = Member(name, address, f"{names().prefix}{name}" if netns else None,
                        log=str(state_dir() / f"{name}.log"), metrics=f"http://{address}:{port}/metrics")
        cgroup = Path(state.cgroups[0]) / name if state.cgroups else None
        worker = WorkerConfig("" if self.cfg.fleet else state.control_endpoint,
                              fleet=state.fleet_endpoint if self.cfg.fleet else "", procs=self.cfg.procs, host_id=name,
                              metrics_addr=address, metrics_port=port, keys=str(state_dir() / "keys"), key_name=name)
        cmd = [sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", *command_line(worker)]
        member.pid = _spawn(cmd, member.netns, cgroup, Path(member.log))
        state.members[name] = member
        state.save()


# ---- operations on a running lab ----------------------------------------------------------

def current() -> LabState:
    state = LabState.load()
    if state is None:
        raise LabError("no lab is up (start one with `stoker lab up`)")
    return state


def kill_host(name: str) -> None:
    """kill -9 a host's whole daemon: the daemon and every worker process it started."""
    member = _member(current(), name)
    if member.pid is not None:
        _signal_group(member.pid, signal.SIGKILL)


def shape_link(ns: str, gbit: float | None, latency_ms: float | None) -> None:
    """Rate (tbf) and one-way latency (netem) on a namespace's eth0."""
    if latency_ms:
        shape = ["delay", f"{latency_ms}ms"] + (["rate", f"{gbit}gbit"] if gbit else [])
        result = run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *shape,
                     check=False)
        if result.returncode != 0:
            raise LabError(f"cannot add latency: {result.stderr.strip()} (this kernel has no sch_netem; "
                           f"--link-gbit alone works with tbf)")
    elif gbit:
        burst = max(32 * 1024, int(gbit * 1e9 / 8 / 250))  # at least one timer tick's worth of bytes
        run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{gbit}gbit",
            "burst", str(burst), "latency", "50ms")


def cut(name: str) -> None:
    """Take a host's link down: nothing gets in or out until `heal`."""
    run("ip", "-n", _namespace_of(name), "link", "set", "eth0", "down")


def heal(name: str) -> None:
    ns = _namespace_of(name)
    run("ip", "-n", ns, "link", "set", "eth0", "up")


def _namespace_of(name: str) -> str:
    ns = _member(current(), name).netns
    if ns is None:
        raise LabError("cutting a link needs the namespace mode (this lab runs on loopback)")
    return ns


def wait(timeout_s: float | None = None) -> dict:
    """Wait for the consumer ranks to finish their job; the closing summary (with several ranks,
    the job's figures and each rank's under "ranks")."""
    from stoker.accel.summary import Summary, job_totals

    state = current()
    consumers = [m for name, m in state.members.items() if name.startswith("accel")]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while any(alive(m.pid) for m in consumers):
        if deadline is not None and time.monotonic() > deadline:
            raise LabError(f"the job is still running after {timeout_s:.0f} s")
        time.sleep(0.2)
    summaries = []
    for rank, member in enumerate(sorted(consumers, key=lambda m: m.name)):
        path = Path(state.summary if rank == 0 else rank_summary(state, rank))
        if not path.exists():
            raise LabError(f"rank {rank} exited without a summary; its log:\n{_tail(member.log)}")
        summaries.append(json.loads(path.read_text()))
    return summaries[0] if len(summaries) == 1 else job_totals([Summary.from_dict(s) for s in summaries]).as_dict()


def rank_summary(state: LabState, rank: int) -> str:
    return str(Path(state.summary).with_name(f"summary-rank{rank}.json"))

def down() -> list[str]:
    """Stop every process and remove everything the lab made; what was removed."""
    state = LabState.load()
    removed: list[str] = []
    members = list(state.members.values()) if state else []
    for member in members:
        if member.pid is not None and alive(member.pid):
            _signal_group(member.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(m.pid is not None and alive(m.pid) for m in members) and time.monotonic() < deadline:
        time.sleep(0.1)
    for member in members:
        if member.pid is not None and alive(member.pid):
            _signal_group(member.pid, signal.SIGKILL)
    lab = names()
    cgroup_root = cpu_cgroup_dir(lab.cgroup)
    cgroups = [Path(p) for p in (state.cgroups if state else [])] + ([cgroup_root] if cgroup_root else [])
    for path in cgroups:
        for pid in cgroup_pids(path):
            _kill(pid, signal.SIGKILL)
    if members or cgroups:
        time.sleep(0.2)
    # by name too, so a crash between making something and saving the state leaves nothing
    for ns in sorted(set((state.netns if state else []) + [n for n in netns_list() if n.startswith(lab.prefix)])):
        if run("ip", "netns", "del", ns, check=False).returncode == 0:
            removed.append(f"netns {ns}")
    for link in sorted(set((state.links if state else []) + [lab.bridge])):
        if link_exists(link) and run("ip", "link", "del", link, check=False).returncode == 0:
            removed.append(f"link {link}")
    for path in cgroups:
        if path.exists():
            remove_cgroup_tree(path)
            removed.append(f"cgroup {path}")
    if (state_dir() / "keys").exists():
        shutil.rmtree(state_dir() / "keys")
        removed.append("lab keys")
    state_file = state_dir() / "state.json"
    if state_file.exists():
        state_file.unlink()
        removed.append(f"state {state_file}")
    return removed
