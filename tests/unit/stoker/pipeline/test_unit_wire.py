"""stoker/pipeline/unit_wire.py: a work unit and its segments, as a worker receives it."""

from stoker.pipeline.unit_wire import unit_from_proto, unit_to_proto
from stoker.pipeline.units import Segment, Unit


def test_a_unit_that_spans_shards_survives_the_wire():
    unit = Unit(41, 2, (Segment(3, 250, 256, 768), Segment(4, 0, 58, 1024)), rank=1, position=5)
    message = unit_to_proto(unit, b"token", "tcp://rank1:5560")
    assert (message.lease_token, message.data_endpoint) == (b"token", "tcp://rank1:5560")
    assert unit_from_proto(message) == unit
