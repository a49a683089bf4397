"""Several hosts for real: `stoker lab` namespaces with CPU quotas, host death and link cuts.

These need root and network namespaces (CI runs as root on a machine like this one); where
either is missing they are skipped with the reason.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stoker.lab import cluster
from stoker.lab.system import can_use_namespaces, cpu_cgroup_dir, netns_list
from tests.helpers import scrape_url, wait_for

WHY_NOT = can_use_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"needs network namespaces: {WHY_NOT}")


def _lab_snapshot() -> tuple:
    """What this test's lab (its own names: cluster.names) has on the machine; nothing else is looked at,
    so a lab or a test run beside this one cannot fail it."""
    lab = cluster.names()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    ours = [name for name in (line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
            if name == lab.bridge or name.startswith(lab.veth(""))]
    cgroup = cpu_cgroup_dir(lab.cgroup)
    return (sorted(n for n in netns_list() if n.startswith(lab.prefix)), sorted(ours),
            cgroup is not None and cgroup.exists())


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    cluster.down()
    assert _lab_snapshot() == ([], [], False)  # a fresh lab of its own
    yield
    cluster.down()
    assert _lab_snapshot() == ([], [], False)  # nothing left behind


def _up(manifest, *train_args: str, hosts: int = 3) -> cluster.LabState:
    return cluster.Lab(cluster.LabConfig(hosts=hosts, cores_per_host=0.5)).up(
        ["--data", manifest.uri, "--batch-size", "16", "--unit-batches", "1", "--host-timeout", "2", *train_args])


def _metric(state: cluster.LabState, name: str) -> float:
    try:
        return scrape_url(state.consumer.metrics).get(name, 0.0)
    except OSError:
        return 0.0


def test_killing_a_host_mid_epoch_loses_nothing(manifest, lab):
    state = _up(manifest, "--epochs", "2", "--accel", "simulated", "--rate", "25", "--host-timeout", "30")
    assert state.mode == "netns" and len(state.members) == 4
    total = 2 * manifest.num_samples
    # early, while every host holds a unit it waits for credit to send (later, h1 may hold none)
    assert wait_for(lambda: _metric(state, "stoker_consumer_samples_total") > 0.1 * total, timeout=60)
    cluster.kill_host("h1")
    killed = time.monotonic()
    # its connections close with it: the re-lease comes then, not after the host timeout, and shows in the metrics
    assert wait_for(lambda: _metric(state, "stoker_dispatcher_releases_total{reason=connection_closed}") >= 1,
                    timeout=30)
    assert time.monotonic() - killed < 5.0  # the host timeout is 30 s
    summary = cluster.wait(timeout_s=120)
    assert summary["samples"] == summary["unique_samples"] == total
    assert summary["per_epoch_unique"] == [manifest.num_samples] * 2
    assert summary["units_released"] >= 1 and summary["hosts"] == 3


def test_a_cut_link_is_healed_and_the_host_rejoins(manifest, lab):
    # long enough that units are still pending at the cut: while any are, every process holds one (it
    # leases the next as soon as it has sent one), so the cut host has leases to lose. (With 2 epochs the
    # consumer's queue had taken in every unit early, and the cut host could hold none.)
    state = _up(manifest, "--epochs", "4", "--accel", "simulated", "--rate", "40")
    total = 4 * manifest.num_samples
    assert wait_for(lambda: _metric(state, "stoker_consumer_samples_total") > 0.1 * total, timeout=60)
    assert _metric(state, "stoker_dispatcher_units{state=pending}") >= 3
    cluster.cut("h2")
    assert wait_for(lambda: _metric(state, "stoker_dispatcher_workers_alive") == 2, timeout=30)
    time.sleep(2)  # longer than the lease timeout
    cluster.heal("h2")
    assert wait_for(lambda: _metric(state, "stoker_dispatcher_workers_alive") == 3, timeout=30)  # rejoined
    summary = cluster.wait(timeout_s=120)
    assert summary["samples"] == summary["unique_samples"] == total  # redone units: nothing twice, nothing lost
    assert summary["per_epoch_unique"] == [manifest.num_samples] * 4
    assert summary["units_released"] >= 1  # the cut host's leases went to the others
    # (whether any of its batches arrive late, to be dropped as duplicates, depends on where the cut
    # caught it: it may have had nothing in flight)


def test_two_consumer_ranks_in_the_lab_share_the_hosts(manifest, lab):
    state = cluster.Lab(cluster.LabConfig(hosts=2, cores_per_host=0.5, ranks=2)).up(
        ["--data", manifest.uri, "--batch-size", "16", "--epochs", "2", "--accel", "simulated", "--rate", "400"])
    assert {"accel", "accel1", "h0", "h1"} <= set(state.members)
    summary = cluster.wait(timeout_s=120)
    assert summary["samples"] == summary["unique_samples"] == 2 * manifest.num_samples
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["ranks"][0]["steps"] == summary["ranks"][1]["steps"]


def test_lab_cli_up_status_down(manifest, lab):
    stoker = [sys.executable, "-m", "stoker", "lab"]
    up = subprocess.run([*stoker, "up", "--hosts", "2", "--cores-per-host", "0.5", "--link-gbit", "1", "--",
                         "--data", manifest.uri, "--epochs", "1"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    lab = cluster.names()  # this test's own (its state folder tags them), not the default lab's stk-h0
    assert lab.tag and lab.accel_address in up.stdout and f"{lab.prefix}h1" in up.stdout
    shaped = subprocess.run(["ip", "netns", "exec", f"{lab.prefix}h0", "tc", "qdisc", "show", "dev", "eth0"],
                            capture_output=True, text=True).stdout
    assert "tbf" in shaped and "1Gbit" in shaped
    quota = cpu_cgroup_dir(lab.cgroup) / "h0"
    assert quota.exists()
    done = subprocess.run([*stoker, "wait"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and '"unique_samples": 160' in done.stdout, done.stderr
    down = subprocess.run([*stoker, "down"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and f"netns {lab.prefix}h0" in down.stdout
    again = subprocess.run([*stoker, "down"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing" in again.stdout


def test_a_fleet_lab_shares_its_hosts_between_two_jobs_across_namespaces(manifest, lab):
    """`stoker lab up --fleet`: the fleet and two jobs in the accelerator's namespace, two hosts in theirs,
    every link CURVE with the lab's keys (workers' and jobs' by role); each job gets every sample once."""
    stoker = [sys.executable, "-m", "stoker", "lab"]
    up = subprocess.run([*stoker, "up", "--fleet", "--hosts", "2", "--cores-per-host", "0.5", "--procs", "2"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert "register with the fleet at tcp://" in up.stdout
    job = ["--data", manifest.uri, "--batch-size", "16", "--epochs", "3", "--accel", "simulated", "--rate", "150"]
    for name in ("job0", "job1"):
        started = subprocess.run([*stoker, "job", name, "--", *job], capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
    state = cluster.current()
    assert wait_for(lambda: len([k for k, v in scrape_url(state.consumer.metrics).items()
                                 if k.startswith("stoker_fleet_job_processes{") and v > 0]) == 2, timeout=60)
    for name in ("job0", "job1"):
        done = subprocess.run([*stoker, "wait", name], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0 and '"unique_samples": 480' in done.stdout and '"samples": 480' in done.stdout, \
            done.stderr
    log = open(state.consumer.log).read()
    assert "host h0 joined" in log and "host h1 joined" in log and log.count("left (it finished)") == 2
    refused = subprocess.run([*stoker, "job", "job9", "--", *job], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "job0 .. job7" in refused.stderr
