"""stoker/protos/sd_notify.py: readiness and watchdog datagrams, as systemd's NOTIFY_SOCKET receives them."""

from __future__ import annotations

import os
import socket

import pytest

from stoker.protos.sd_notify import Notifier


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    """A datagram socket standing in for systemd's, named in NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def _pending(sock: socket.socket) -> list[str]:
    sock.setblocking(False)
    try:
        out = []
        while True:
            try:
                out.append(sock.recv(4096).decode())
            except BlockingIOError:
                return out
    finally:
        sock.settimeout(5)


def test_ready_and_stopping_reach_systemd(systemd):
    notifier = Notifier()
    assert notifier.enabled
    notifier.ready("serving job abc")
    assert systemd.recv(4096) == b"READY=1\nSTATUS=serving job abc"
    notifier.ready()
    assert systemd.recv(4096) == b"READY=1"
    notifier.stopping()
    assert systemd.recv(4096) == b"STOPPING=1"


def test_the_watchdog_is_pinged_at_most_every_quarter_of_its_timeout(systemd, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", str(3600 * 10**6))  # an hour: a quarter is 15 minutes
    notifier = Notifier()
    assert notifier.watchdog_interval == 900
    for _ in range(5):
        notifier.watchdog()
    assert systemd.recv(4096) == b"WATCHDOG=1"
    assert _pending(systemd) == []  # the four calls after the first were inside the interval


def test_a_watchdog_meant_for_another_process_is_not_ours(systemd, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    notifier = Notifier()
    assert notifier.watchdog_interval is None
    notifier.watchdog()
    assert _pending(systemd) == []
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier().watchdog_interval == 1.0


def test_an_abstract_socket_name_is_reached(monkeypatch):
    name = f"stoker-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        Notifier().stopping()
        assert sock.recv(4096) == b"STOPPING=1"


def test_without_systemd_every_call_is_a_quiet_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    notifier = Notifier()
    assert not notifier.enabled and notifier.watchdog_interval is None
    notifier.ready("x")
    notifier.watchdog()
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))  # systemd went away: nothing to tell, no error
    Notifier().ready()
