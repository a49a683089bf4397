"""Fixtures the wire's unit tests share."""

from __future__ import annotations

import pytest
import zmq


@pytest.fixture
def ctx():
    """A ZeroMQ context of the test's own, destroyed without lingering on unsent messages."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)
