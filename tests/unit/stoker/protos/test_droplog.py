"""stoker/protos/droplog.py: every refusal is counted; only the first few and every Nth are logged."""

import logging

from prometheus_client import CollectorRegistry, Counter

from stoker.protos.droplog import DropLog


def test_a_flood_is_counted_in_full_and_logged_sparsely(caplog):
    registry = CollectorRegistry()
    metric = Counter("dropped", "test", ["reason"], registry=registry)
    drops = DropLog(logging.getLogger("test.drops"), "a message", metric, first=3, every=100)
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        for _ in range(250):
            drops("malformed", b"peer", "x" * 500)
        drops("too_big", b"other")
    assert drops.counts == {"malformed": 250, "too_big": 1}
    assert registry.get_sample_value("dropped_total", {"reason": "malformed"}) == 250
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 + 2 + 1  # 1, 2, 3, 100, 200 of one reason; the first of the other
    assert all(len(line) < 300 for line in lines)  # the detail is cut, a flood cannot flood the log
    assert "250" not in lines[-2] and lines[-1].endswith("too_big; 1 so far")
