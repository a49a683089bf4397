"""stoker/protos/exposure.py: without keys, nothing listens beyond loopback unless told the network is trusted."""

from __future__ import annotations

import re

import pytest

from stoker.protos.exposure import check_exposure, exposure_problem

LOOPBACK = {"data_bind": "tcp://127.0.0.1:5560", "control_bind": "tcp://[::1]:5561", "bind": "tcp://localhost:0",
            "ipc": "ipc:///tmp/s", "metrics_addr": "127.0.0.1"}


def test_loopback_needs_nothing():
    check_exposure(LOOPBACK, keyed=False, insecure=False)
    assert exposure_problem(LOOPBACK, keyed=False, insecure=False) is None


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5560", "tcp://10.0.0.2:5561", "tcp://host-a:0",
                                      "0.0.0.0"])
def test_beyond_loopback_without_keys_is_refused_naming_the_field_the_endpoint_the_risk_and_the_fix(endpoint):
    said = f"exposed: {endpoint} is beyond loopback; without CURVE keys anyone who reaches it could read the " \
           "metrics: give --keys"
    assert exposure_problem({**LOOPBACK, "exposed": endpoint}, keyed=False, insecure=False, risk="read the metrics",
                            fix="give --keys") == said
    with pytest.raises(ValueError, match=re.escape(said)):  # the same words, refused
        check_exposure({**LOOPBACK, "exposed": endpoint}, keyed=False, insecure=False, risk="read the metrics",
                       fix="give --keys")
    with pytest.raises(ValueError, match=r"stoker keys init DIR.*--insecure"):  # the default fix
        check_exposure({"metrics_addr": endpoint}, keyed=False, insecure=False)


def test_keys_or_an_explicit_insecure_allow_it():
    check_exposure({"data_bind": "tcp://0.0.0.0:5560"}, keyed=True, insecure=False)
    check_exposure({"data_bind": "tcp://0.0.0.0:5560"}, keyed=False, insecure=True)
    assert exposure_problem({"data_bind": "tcp://0.0.0.0:5560"}, keyed=False, insecure=True) is None
