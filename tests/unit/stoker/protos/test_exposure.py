"""stoker/protos/exposure.py: without keys, nothing listens beyond loopback unless told the network is trusted."""

from __future__ import annotations

import re

import pytest

from stoker.protos.exposure import check_exposure

LOOPBACK = ["tcp://127.0.0.1:5560", "tcp://[::1]:5561", "tcp://localhost:0", "ipc:///tmp/s", "127.0.0.1"]


def test_loopback_needs_nothing():
    check_exposure(LOOPBACK, keyed=False, insecure=False)


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5560", "tcp://10.0.0.2:5561", "tcp://host-a:0",
                                      "0.0.0.0"])
def test_beyond_loopback_without_keys_is_refused_naming_the_endpoint_the_risk_and_the_fix(endpoint):
    with pytest.raises(ValueError, match=rf"refusing to bind {re.escape(endpoint)} without CURVE keys: anyone who "
                                         r"can reach it could read the metrics; give --keys"):
        check_exposure([*LOOPBACK, endpoint], keyed=False, insecure=False, risk="read the metrics",
                       fix="give --keys")
    with pytest.raises(ValueError, match=r"stoker keys init DIR.*--insecure"):  # the default fix
        check_exposure([endpoint], keyed=False, insecure=False)


def test_keys_or_an_explicit_insecure_allow_it():
    check_exposure(["tcp://0.0.0.0:5560"], keyed=True, insecure=False)
    check_exposure(["tcp://0.0.0.0:5560"], keyed=False, insecure=True)
