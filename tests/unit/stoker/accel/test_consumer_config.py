"""A consumer's config refuses, where a script makes it, what the command line refuses at parse time."""

from __future__ import annotations

import pytest

from stoker import ConsumerConfig
from stoker.protos.errors import ConfigError


@pytest.mark.parametrize("given, says", [
    ({"credit_window": 0}, "credit_window must be an integer of at least 1, not 0"),
    ({"decode_threads": True}, "decode_threads must be an integer of at least 1, not True"),
    ({"metrics_port": -2}, "metrics_port must be a port 0-65535"),
    ({"metrics_port": 70000}, "metrics_port must be a port 0-65535"),
    ({"metrics_port": True}, "metrics_port must be a port"),
    ({"data_bind": "bogus"}, "data_bind must be an endpoint tcp://HOST:PORT"),
    ({"dispatcher": "tcp://host"}, "dispatcher must be an endpoint"),
    ({"sender_timeout_s": float("nan")}, "sender_timeout_s must be a number above 0"),
    ({"stall_report_s": 10.0, "stall_timeout_s": 5.0}, "stall_report_s [(]10[)] must be below stall_timeout_s"),
])
def test_a_value_that_cannot_work_is_refused_when_the_config_is_made(given, says):
    with pytest.raises(ConfigError, match=f"^ConsumerConfig: {says}"):
        ConsumerConfig(**given)


@pytest.mark.parametrize("given", [{}, {"metrics_port": -1}, {"metrics_port": None}, {"metrics_port": 0},
                                   {"stall_timeout_s": 0.0}, {"dispatcher": "tcp://10.0.0.5:5561"},
                                   {"data_bind": "tcp://*:5560"}, {"data_bind": "ipc:///tmp/stoker-data"}])
def test_the_documented_values_are_taken(given):
    ConsumerConfig(**given)
