"""stoker/accel/control/dispatch_config.py: `stoker dispatch`'s options, and where its job secret is kept."""

from __future__ import annotations

from stoker.accel.control.dispatch_config import DispatchConfig
from stoker.cli import build_parser
from stoker.configured import config_of


def test_the_secret_is_kept_where_asked_else_beside_the_journal():
    assert DispatchConfig(job_secret="/run/s").secret_path() == "/run/s"
    assert DispatchConfig(journal="/var/j").secret_path() == "/var/j.secret"
    assert DispatchConfig(control_bind="tcp://127.0.0.1:7000").secret_path().endswith("stoker-job-7000.secret")


def test_stoker_dispatch_makes_the_config_from_its_options():
    parse = build_parser().parse_args
    assert config_of(DispatchConfig, parse(["dispatch", "--data", "m"])) == DispatchConfig()
    cfg = config_of(DispatchConfig, parse(["dispatch", "--data", "m", "--journal", "j", "--metrics-port", "-1",
                                           "--host-timeout", "4", "--lease-timeout", "9", "--insecure"]))
    assert cfg == DispatchConfig(journal="j", metrics_port=None, host_timeout_s=4.0, lease_timeout_s=9.0,
                                 insecure=True)
