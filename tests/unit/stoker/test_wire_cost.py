"""stoker/wire_cost.py: a calibration frames and sends each batch over CURVE to a real sink process,
and a sink that stops taking batches is reported within the send deadline, not waited on."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stoker import wire_cost
from stoker.protos import stoker_pb2 as pb
from stoker.wire_cost import SinkError, WireSink


def _batch() -> dict[str, np.ndarray]:
    return {"image": np.zeros((64, 224, 224, 3), np.uint8), "label": np.arange(64, dtype=np.int32)}


def test_sending_costs_the_sender_cpu_and_the_sink_takes_every_batch():
    with WireSink() as sink:
        started = time.process_time()
        for _ in range(40):
            sink.send(pb.BatchHeader(rows=64), _batch())
        spent = time.process_time() - started
    assert spent > 0.01  # framing, encryption and TCP: CPU of this process (its zmq I/O thread included)
    assert sink.sink is None  # closed: the sink process is gone


def test_a_sink_that_stops_taking_batches_is_reported_within_the_deadline(monkeypatch):
    monkeypatch.setattr(wire_cost, "SEND_S", 1.0)
    with WireSink() as sink, pytest.raises(SinkError, match="took no batch for 1 s"):
        assert sink.sink is not None
        sink.sink.kill()
        sink.sink.wait(10)
        started = time.monotonic()
        for _ in range(1000):  # the queue and the socket buffers fill, then a send waits out the deadline
            sink.send(pb.BatchHeader(rows=64), _batch())
    assert time.monotonic() - started < 30
