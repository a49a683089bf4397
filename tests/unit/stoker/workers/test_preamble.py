"""stoker/workers/preamble.py: a host daemon's settings are checked before anything starts, it drains on
SIGTERM and SIGINT, tells systemd it is ready and stopping, and knows when its parent is gone."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from stoker.protos.errors import ConfigError
from stoker.workers.preamble import HostPreamble, check_host_settings
from stoker.workers.worker_config import WorkerConfig, most_procs


@pytest.mark.parametrize("cfg, says", [(WorkerConfig(procs=0), "--procs must be 1 to"),
                                       (WorkerConfig(procs=most_procs() + 1), "--procs must be 1 to"),
                                       (WorkerConfig(metrics_addr="0.0.0.0"),
                                        "metrics_addr: 0.0.0.0 is beyond loopback")])
def test_settings_the_host_cannot_serve_with_are_refused_at_start(cfg, says):
    with pytest.raises(ConfigError, match=says):
        check_host_settings(cfg)
    with pytest.raises(ConfigError, match=says):
        HostPreamble(cfg, "host0")


def test_the_preamble_installs_its_stop_handler_tells_systemd_and_serves_no_metrics_when_told_none(tmp_path,
                                                                                                  monkeypatch):
    address = str(tmp_path / "notify")
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(address)
    systemd.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    heard: list[int] = []
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        host = HostPreamble(WorkerConfig(metrics_port=None), "host0")
        host.begin(lambda signum, _frame: heard.append(signum), "registering with tcp://x:1")
        assert systemd.recv(256) == b"READY=1\nSTATUS=registering with tcp://x:1"
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert heard == [signal.SIGTERM, signal.SIGINT]
        assert host.metrics_port is None and host.alive() and not host.parent_gone()
        host.end()
        assert systemd.recv(256) == b"STOPPING=1"
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
        systemd.close()


def test_a_daemon_whose_parent_is_gone_is_not_alive():
    host = HostPreamble(WorkerConfig(parent_pid=os.getppid() + 1), "host0")  # not this process's parent
    assert host.parent_gone() and not host.alive()
    assert not HostPreamble(WorkerConfig(parent_pid=os.getppid()), "host0").parent_gone()
