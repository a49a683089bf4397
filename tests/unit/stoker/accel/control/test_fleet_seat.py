"""A job's ask of a fleet: what cannot work is said in one line, before anything starts."""

from __future__ import annotations

import pytest

from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.fleet_seat import fleet_problem
from stoker.protos.errors import ConfigError


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), True, "2"])
def test_a_weight_that_is_not_a_number_above_zero_is_refused(weight):
    assert "weight must be a number from" in fleet_problem("tcp://f:1", weight, 0, None)


def test_limits_that_cannot_hold_are_refused():
    assert "min_cores" in fleet_problem("tcp://f:1", 1.0, -1, None)
    assert "max_cores must be an integer of at least min_cores (3)" in fleet_problem("tcp://f:1", 1.0, 3, 2)
    assert "at least min_cores (0) and 1" in fleet_problem("tcp://f:1", 1.0, 0, 0)
    assert fleet_problem("tcp://f:1", 2.5, 1, 4) is None


def test_an_ask_without_a_fleet_is_refused():
    assert "give the fleet too" in fleet_problem(None, 2.0, 0, None)
    assert fleet_problem(None, 1.0, 0, None) is None


def test_a_script_config_is_checked_as_the_flags_are():
    with pytest.raises(ConfigError, match="weight must be a number from"):
        ConsumerConfig(fleet="tcp://127.0.0.1:5570", weight=0.0)
    with pytest.raises(ConfigError, match="fleet"):
        ConsumerConfig(fleet="not an endpoint")
