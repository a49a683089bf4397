"""stoker/protos/endpoints.py: binding with errors a person can act on, and what peers connect to."""

from __future__ import annotations

import socket

import pytest
import zmq

from stoker.protos.endpoints import (
    PortInUseError,
    advertised,
    bind,
    endpoint_problem,
    peer_endpoint_problem,
    why_unreachable,
)


def test_port_0_binds_a_free_port_and_says_which(ctx):
    bound = bind(ctx.socket(zmq.ROUTER), "tcp://127.0.0.1:0", "data")
    assert bound.startswith("tcp://127.0.0.1:") and int(bound.rsplit(":", 1)[1]) > 0


def test_a_taken_port_is_a_clear_error(ctx):
    holder = ctx.socket(zmq.ROUTER)
    bound = bind(holder, "tcp://127.0.0.1:0", "data")
    with pytest.raises(PortInUseError, match=f"control endpoint {bound} is already in use"):
        bind(ctx.socket(zmq.ROUTER), bound, "control")


def test_an_unbindable_endpoint_names_what_it_was_for(ctx):
    with pytest.raises(OSError, match="cannot bind metrics endpoint nonsense://x"):
        bind(ctx.socket(zmq.ROUTER), "nonsense://x", "metrics")


@pytest.mark.parametrize(("bound", "host", "expected"), [
    ("tcp://0.0.0.0:5561", None, "tcp://127.0.0.1:5561"),  # a wildcard is reached on loopback here
    ("tcp://*:5561", None, "tcp://127.0.0.1:5561"),
    ("tcp://0.0.0.0:5561", "10.0.0.5", "tcp://10.0.0.5:5561"),  # what peers on other hosts use
    ("tcp://10.0.0.7:5561", None, "tcp://10.0.0.7:5561"),
])
def test_peers_are_told_an_address_they_can_reach(bound, host, expected):
    assert advertised(bound, host) == expected


def test_why_unreachable_says_what_a_tcp_connection_meets():
    assert why_unreachable("ipc:///tmp/x") == "not a TCP endpoint"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert why_unreachable(f"tcp://127.0.0.1:{port}").startswith("nothing listens there yet")  # bound, no listen
        listener.listen()
        assert why_unreachable(f"tcp://127.0.0.1:{port}").startswith("something listens there but does not answer")


def test_a_metrics_port_of_minus_one_serves_none_wherever_a_config_takes_it(tmp_path):
    """-1 is what --metrics-port documents for "serve none"; a config given it in code means the same."""
    from stoker.protos.endpoints import serves

    assert [serves(p) for p in (None, -1, 0, 9560)] == [False, False, True, True]
    from stoker.accel.consumer import Consumer
    from stoker.accel.consumer_config import ConsumerConfig
    from tests.unit.stoker.accel.fakes import job

    cfg = ConsumerConfig(metrics_port=-1, data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0")
    consumer = Consumer(cfg, job(tmp_path))
    try:
        consumer.start()
        assert consumer.metrics_port is None
    finally:
        consumer.stop()


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:*", "tcp://*:5561", "tcp://127.0.0.1:0", "tcp://h:00"])
def test_an_endpoint_to_connect_to_names_a_peer_not_a_wildcard(endpoint):
    """* and port 0 pick an address on a bind; connected to, ZeroMQ refuses them with a traceback (or a worker
    daemon retried them for ever): they are refused where the flag or config is given."""
    assert endpoint_problem(endpoint) is None
    assert "must be where a peer listens" in peer_endpoint_problem(endpoint)
    assert peer_endpoint_problem("tcp://10.0.0.5:5561") is None and peer_endpoint_problem("ipc:///tmp/x") is None
    assert "must be an endpoint" in peer_endpoint_problem("nonsense")
