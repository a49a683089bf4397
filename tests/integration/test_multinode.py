"""Several accelerator nodes and several CPU hosts, each in a network namespace of its own, running
the README's example (examples/train_ddp.py) as written, with the README's commands.

Two nodes of one rank each (`torchrun --nnodes 2 --node-rank R --master-addr NODE0`) and two CPU
hosts (`stoker worker --dispatcher tcp://NODE0:5561`), on a bridge in a 198.19.X.0/24 of the run's own. The ranks
take their addresses from torchrun's environment and meet through its store; nothing else is
configured but the keys ($STOKER_KEYS on the nodes, --keys on the hosts). Needs root and network
namespaces; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.lab.system import can_use_namespaces, run
from stoker.pipeline.store.shards import Manifest
from stoker.protos.curve import add_key, init_keys
from tests.helpers import free_port, wait_for

WHY_NOT = can_use_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"needs network namespaces: {WHY_NOT}")

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
RECORDER = ROOT / "tests" / "record_loader.py"
# names and a subnet of this test run's own, so a second run (or a lab) on the machine never meets them
TAG = f"{os.getpid() % 10000:04d}"
BRIDGE, PREFIX = f"stkmn{TAG}", f"stkmn{TAG}-"
SUBNET = f"198.19.{os.getpid() % 250}"
NODES = {"node0": f"{SUBNET}.1", "node1": f"{SUBNET}.2", "cpu0": f"{SUBNET}.10", "cpu1": f"{SUBNET}.11"}


@pytest.fixture
def network():
    """The four machines on one bridge; everything is removed afterwards, also after a failure."""
    made: list[tuple[str, ...]] = []
    try:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        made.append(("ip", "link", "del", BRIDGE))
        run("ip", "addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for name, address in NODES.items():
            ns, veth = PREFIX + name, f"stkmv{TAG}-{name}"  # at most 15 characters
            run("ip", "netns", "add", ns)
            made.append(("ip", "netns", "del", ns))
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            made.append(("ip", "link", "del", veth))
            run("ip", "link", "set", veth, "master", BRIDGE, "up")
            run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for command in reversed(made):
            run(*command, check=False)


class Machines:
    """Processes started inside the namespaces, each in a session of its own (killed whole at the end)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, machine: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        full = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        full.update(env or {})
        full["PYTHONPATH"] = str(ROOT)
        log = open(self.folder / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(["ip", "netns", "exec", PREFIX + machine, *cmd], stdout=log,
                                            stderr=subprocess.STDOUT, env=full, start_new_session=True)

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _node(machines: Machines, node: int, master_port: int, manifest: Manifest, env: dict[str, str]) -> None:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    machines.start(f"node{node}", f"node{node}", [
        torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
        "--master-addr", NODES["node0"], "--master-port", str(master_port),
        str(RECORDER), str(machines.folder), str(EXAMPLE), manifest.uri,
        "--epochs", "2", "--batch-size", "13", "--image-size", "32", "--checkpoint", str(machines.folder / "ck.pt")],
        env={"GLOO_SOCKET_IFNAME": "eth0", **env})  # gloo's own interface choice (torch's, not Stoker's)


def test_the_readme_example_on_two_nodes_fed_by_two_cpu_hosts(network, manifest, tmp_path):
    keys = tmp_path / "keys"
    init_keys(keys)
    for name in ("cpu0", "cpu1"):
        add_key(keys, name)
    add_key(keys, "consumer", role="consumer")  # the other ranks attach to rank 0's dispatcher with it
    machines = Machines(tmp_path)
    try:
        for host in ("cpu0", "cpu1"):
            machines.start(host, host, [sys.executable, "-m", "stoker", "--log-level", "INFO", "worker", "--dispatcher",
                                        f"tcp://{NODES['node0']}:5561", "--keys", str(keys), "--key-name", host,
                                        "--once"])
        port = free_port()
        for node in (0, 1):
            _node(machines, node, port, manifest, {"STOKER_KEYS": str(keys)})
        codes = [machines.wait(f"node{n}", 180) for n in (0, 1)]
        assert codes == [0, 0], machines.log("node0") + machines.log("node1") + machines.log("cpu0")
        assert [machines.wait(h, 30) for h in ("cpu0", "cpu1")] == [0, 0], machines.log("cpu0")
    finally:
        machines.stop()
    steps = {r: [json.loads(x) for x in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    for epoch in (0, 1):
        streams = [[s for s in steps[r] if s["epoch"] == epoch] for r in (0, 1)]
        assert len(streams[0]) == len(streams[1]) > 0
        ids = sorted(i for stream in streams for s in stream for i in s["ids"])
        assert ids == list(range(manifest.num_samples))
    # both hosts fed the job, each over the bridge to the nodes' own addresses
    joined = [line for h in ("cpu0", "cpu1") for line in machines.log(h).splitlines() if "joined job" in line]
    assert len(joined) == 2 and all(NODES["node0"] in line for line in joined)


def test_without_keys_or_insecure_a_rank_of_a_multi_node_job_says_what_to_set(network, manifest, tmp_path):
    machines = Machines(tmp_path)
    started = time.monotonic()
    try:
        port = free_port()
        for node in (0, 1):
            _node(machines, node, port, manifest, {})
        codes = [machines.wait(f"node{n}", 60) for n in (0, 1)]
    finally:
        machines.stop()
    assert codes[0] not in (0, None) and time.monotonic() - started < 60
    log = machines.log("node0")
    assert "several machines" in log and "STOKER_KEYS" in log and "STOKER_INSECURE" in log, log


def _elastic_node(machines: Machines, node: int, manifest: Manifest) -> None:
    """torchrun's elastic mode: 1 to 2 nodes, restarted (with whoever is left) when one fails."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    machines.start(f"node{node}", f"node{node}", [
        torchrun, "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval", "0.5",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{NODES['node0']}:29400", "--rdzv-id", "elastic",
        "--rdzv-conf", f"last_call_timeout=3,is_host={str(node == 0).lower()}", "--local-addr", NODES[f"node{node}"],
        str(RECORDER), str(machines.folder), str(EXAMPLE), manifest.uri, "--epochs", "3", "--batch-size", "8",
        "--image-size", "32", "--save-every", "5", "--checkpoint", str(machines.folder / "ck.pt")],
        env={"GLOO_SOCKET_IFNAME": "eth0", "STOKER_INSECURE": "1"})


def test_an_elastic_job_that_loses_a_node_continues_at_the_smaller_world_size(network, manifest, tmp_path):
    """`torchrun --nnodes 1:2` on two nodes; once rank 0 has saved a checkpoint, node1 is killed (every
    process in it). torchrun restarts node0's rank alone, and the example resumes from its
    checkpoint at world size 1: the epochs are every sample once across the two rounds."""
    machines = Machines(tmp_path)
    try:
        for host in ("cpu0", "cpu1"):  # long-lived daemons, as systemd runs them
            machines.start(host, host, [sys.executable, "-m", "stoker", "worker", "--dispatcher",
                                        f"tcp://{NODES['node0']}:5561"])
        for node in (0, 1):
            _elastic_node(machines, node, manifest)
        record = tmp_path / "rank-0.jsonl"
        assert wait_for(lambda: (tmp_path / "ck.pt").exists() and record.exists()
                        and len(record.read_text().splitlines()) >= 8, timeout=120), machines.log("node0")
        pids = run("ip", "netns", "pids", PREFIX + "node1").stdout.split()
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        assert machines.wait("node0", 180) == 0, machines.log("node0")
    finally:
        machines.stop()
    records = [json.loads(line) for r in (0, 1) for line in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()]
    last = max(x["restart"] for x in records)
    final = [x for x in records if x["restart"] == last]
    assert last >= 1 and {x["world"] for x in final} == {1}  # the last round ran at world size 1
    start = (final[0]["epoch"], final[0]["step"])
    kept = [x for x in records if x["restart"] < last and (x["epoch"], x["step"]) < start] + final
    for epoch in range(3):
        ids = sorted(i for x in kept if x["epoch"] == epoch for i in x["ids"])
        assert ids == list(range(manifest.num_samples)), f"epoch {epoch}: not every sample once"


LM_EXAMPLE = ROOT / "examples" / "train_lm_ddp.py"


def _elastic_lm_node(machines: Machines, node: int, manifest: Manifest) -> None:
    """examples/train_lm_ddp.py under torchrun's elastic mode, 1 to 2 nodes, a checkpoint every 5 steps."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    machines.start(f"node{node}", f"node{node}", [
        torchrun, "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval", "0.5",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{NODES['node0']}:29400", "--rdzv-id", "elastic-lm",
        "--rdzv-conf", f"last_call_timeout=3,is_host={str(node == 0).lower()}", "--local-addr", NODES[f"node{node}"],
        str(RECORDER), str(machines.folder), str(LM_EXAMPLE), manifest.uri, "--epochs", "2", "--batch-size", "4",
        "--seq-len", "64", "--vocab-size", "1024", "--save-every", "5", "--checkpoint", str(machines.folder / "ck.pt")],
        # torch 2.13's shared rendezvous store: a node that joins a running job waits for ever for an address
        # the rank 0 agent sets only on its first round (dynamic_rendezvous.py); not sharing it works
        env={"GLOO_SOCKET_IFNAME": "eth0", "STOKER_INSECURE": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})


def _rounds(folder: Path) -> list[list[dict]]:
    """Every rank's records, in time order, cut where the world size changes: one list per round of the job."""
    records = sorted((json.loads(line) for f in folder.glob("rank-*.jsonl") for line in f.read_text().splitlines()),
                     key=lambda x: x["at"])
    rounds: list[list[dict]] = []
    for record in records:
        if not rounds or rounds[-1][-1]["world"] != record["world"]:
            rounds.append([])
        rounds[-1].append(record)
    return rounds


def test_an_elastic_lm_job_grows_to_two_nodes_and_shrinks_back_with_every_document_once(network, tmp_path):
    """examples/train_lm_ddp.py on a token set, `torchrun --nnodes 1:2`: node0 alone, then node1 joins (torchrun
    restarts the job at world size 2 from rank 0's last checkpoint), then node1 is killed (back at 1 from the
    checkpoint of the 2-rank round). Each round takes up where the checkpoint it loaded stood; what every round
    stepped before the next one's start, and the last round, hold each epoch's planned documents once."""
    from stoker.pipeline.job import JobConfig
    from stoker.pipeline.text.lm_layout import LMConfig
    from tests.token_corpus import prepared

    manifest = prepared(tmp_path / "data", count=300, docs_per_shard=100)[0].manifest
    machines = Machines(tmp_path)
    records = tmp_path / "rank-0.jsonl"

    def at_world(world: int, steps: int) -> bool:
        lines = records.read_text().splitlines() if records.exists() else []
        return sum(json.loads(line)["world"] == world for line in lines) >= steps and (tmp_path / "ck.pt").exists()

    try:
        for host in ("cpu0", "cpu1"):  # long-lived daemons, as systemd runs them
            machines.start(host, host, [sys.executable, "-m", "stoker", "worker", "--dispatcher",
                                        f"tcp://{NODES['node0']}:5561"])
        _elastic_lm_node(machines, 0, manifest)
        assert wait_for(lambda: at_world(1, 8), timeout=120), machines.log("node0")
        _elastic_lm_node(machines, 1, manifest)
        assert wait_for(lambda: at_world(2, 12), timeout=120), machines.log("node0") + machines.log("node1")
        for pid in run("ip", "netns", "pids", PREFIX + "node1").stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        assert machines.wait("node0", 240) == 0, machines.log("node0")
    finally:
        machines.stop()
    rounds = _rounds(tmp_path)
    assert [r[0]["world"] for r in rounds] == [1, 2, 1], [(r[0]["world"], len(r)) for r in rounds]
    starts = [min((x["epoch"], x["step"]) for x in r) for r in rounds]
    kept = [x for r, nxt in zip(rounds, starts[1:], strict=False) for x in r if (x["epoch"], x["step"]) < nxt]
    kept += rounds[-1]
    plan = JobConfig(manifest_uri=manifest.uri, dataset="tokens", epochs=2, batch_size=4, lm=LMConfig(64)).plan(
        manifest)
    for epoch in range(2):
        ids = sorted(i for x in kept if x["epoch"] == epoch for i in x["ids"])
        assert ids == sorted(int(i) for u in plan.units(epoch) for i in u.sample_ids()), \
            f"epoch {epoch}: not every planned document once"
