"""deploy/: the systemd units, Kubernetes manifests, Prometheus config and rules and the Grafana
dashboard pass their real validators, name only metrics Stoker exports, and the daemons speak
systemd's notify protocol."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
VENV_BIN = Path(sys.executable).parent


def _exported_metric_names() -> set[str]:
    """Every family the consumer, dispatcher and workers register, with the suffixes Prometheus adds."""
    from stoker.accel.bottleneck import BottleneckMonitor, Totals
    from stoker.accel.fleet.service import FleetMetrics
    from stoker.accel.metrics import ConsumerMetrics
    from stoker.workers.metrics import WorkerMetrics

    consumer = ConsumerMetrics()
    fleet = FleetMetrics()
    BottleneckMonitor(lambda: Totals(), consumer.registry)
    try:
        WorkerMetrics()  # registers in the default registry, as in a worker process
    except ValueError:
        pass  # already registered by an earlier test in this process
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for registry in (consumer.registry, fleet.registry, REGISTRY)
            for family in registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


def _metric_names_in(text: str) -> set[str]:
    return set(re.findall(r"\bstoker_[a-z_]+", text))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", ["stoker-worker.service", "stoker-consumer.service", "stoker-fleet.service"])
def test_systemd_units_verify_cleanly(unit, tmp_path):
    text = (DEPLOY / "systemd" / unit).read_text().replace("/opt/stoker/.venv/bin", str(VENV_BIN))
    assert "Type=notify" in text and "WatchdogSec=" in text and "Restart=on-failure" in text
    (tmp_path / unit).write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)], capture_output=True, text=True)
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if unit in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_prometheus_config_and_rules_pass_promtool():
    config = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True)
    assert config.returncode == 0, config.stdout + config.stderr
    rules = subprocess.run(["promtool", "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
                           capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout


def test_kubernetes_manifests_match_the_schema():
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    out = subprocess.run([str(VENV_BIN / "kubernetes-validate"), "--strict", "-k", "1.30.0", *map(str, manifests)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    kinds = {doc["kind"] for path in manifests for doc in yaml.safe_load_all(path.read_text()) if doc}
    assert {"DaemonSet", "StatefulSet", "Service", "ConfigMap", "Deployment", "HorizontalPodAutoscaler"} <= kinds
    daemonset = next(doc for path in manifests for doc in yaml.safe_load_all(path.read_text())
                     if doc and doc["kind"] == "DaemonSet")
    shm = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm and shm[0]["emptyDir"]["medium"] == "Memory"


def test_the_fleets_autoscaler_sizes_its_workers_from_a_metric_the_fleet_exports():
    docs = [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "stoker-fleet.yaml").read_text()) if doc]
    hpa = next(doc for doc in docs if doc["kind"] == "HorizontalPodAutoscaler")
    workers = next(doc for doc in docs if doc["kind"] == "Deployment" and doc["metadata"]["name"] ==
                   hpa["spec"]["scaleTargetRef"]["name"])
    worker_args = " ".join(workers["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--fleet tcp://stoker-fleet:5570" in worker_args
    (metric,) = hpa["spec"]["metrics"]
    name = metric["external"]["metric"]["name"]
    assert name in _exported_metric_names()
    procs = re.search(r"--procs (\d+)", worker_args)
    assert procs and metric["external"]["target"]["averageValue"] == procs.group(1)  # replicas = wanted / procs
    rules = yaml.safe_load(next(doc for doc in docs if doc["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert {rule["name"]["as"] for rule in rules["externalRules"]} == {name}
    assert _metric_names_in(" ".join(r["metricsQuery"] for r in rules["externalRules"])) <= _exported_metric_names()


def test_alerts_and_dashboard_name_only_exported_metrics():
    exported = _exported_metric_names()
    exported |= {"up"}
    used = _metric_names_in((DEPLOY / "prometheus" / "alerts.yml").read_text())
    dashboard = json.loads((DEPLOY / "grafana" / "stoker-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used |= _metric_names_in("\n".join(exprs))
    assert used and used <= exported, sorted(used - exported)
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("throughput", "stall", "stage", "host"):
        assert topic in titles


def test_the_worker_daemon_tells_systemd_ready_feeds_the_watchdog_and_says_stopping(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000", "PATH": "/usr/bin:/bin"}
    daemon = subprocess.Popen([sys.executable, "-m", "stoker", "worker", "--dispatcher", "tcp://127.0.0.1:1",
                               "--metrics-port", "-1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        messages = [sock.recv(4096).decode()]
        assert messages[0].startswith("READY=1")
        started = time.monotonic()
        while sum(m == "WATCHDOG=1" for m in messages) < 3:
            messages.append(sock.recv(4096).decode())
        assert time.monotonic() - started < 5  # pinged about every 0.1 s while waiting for a dispatcher
        daemon.send_signal(signal.SIGTERM)
        while messages[-1] != "STOPPING=1":
            messages.append(sock.recv(4096).decode())
        assert daemon.wait(20) == 0
    finally:
        daemon.kill()
        sock.close()
