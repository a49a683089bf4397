"""stoker/plan_check.py: the lab device is sized so the plan says K cores; the verdict and the
planner's error come from the measured stalls and the host-bound point's rate."""

from __future__ import annotations

import pytest

from stoker import plan_check
from stoker.plan_check import CheckConfig, CheckPoint, CheckResult, describe
from stoker.sweep import Point


def _cfg(**kw) -> CheckConfig:
    return CheckConfig(**{"dataset": "imagenet", "per_core_rate": 1000.0, "data": "unused", **kw})


def test_the_device_is_sized_so_the_plan_says_exactly_k_cores():
    cfg = _cfg(cores=1.0)
    assert cfg.device_rate == pytest.approx(1000 / 0.98)  # (1 - s) A / r = K
    assert cfg.predicted_stall(1.0) == pytest.approx(0.02)
    assert cfg.predicted_stall(0.8) == pytest.approx(1 - 0.8 * 0.98)
    assert cfg.predicted_stall(2.0) == 0.0  # more cores than the device takes: no stall
    # packed text: the plan counts sequences, the device steps rows that carry 1.25 of them
    assert _cfg(dataset="wikipedia", samples_per_row=1.25).device_rate == pytest.approx(0.5 * 1000 / 0.98 / 1.25)


def _result(stall_k: float, stall_short: float, short_rate: float) -> CheckResult:
    return CheckResult(dataset="imagenet", transform="train", plan_rate=1000.0, stall_target=0.02, device_rate=1020,
                       points=[CheckPoint(1.0, 0.02, stall_k, 1000 * (1 - stall_k), 1000 * (1 - stall_k), 0.0),
                               CheckPoint(0.8, 0.216, stall_short, 0.8 * short_rate, short_rate, 0.0)])


def test_the_prediction_holds_only_with_the_stall_under_the_target_at_k_and_over_it_short_of_k():
    assert _result(0.01, 0.2, 1000).holds
    assert not _result(0.2, 0.35, 800).holds  # the job wanted 25% more CPU than the plan said
    assert not _result(0.0, 0.01, 2000).holds  # the plan was pessimistic: 0.8 K still fed it


def test_the_planner_error_is_the_plan_rate_over_the_host_bound_rate():
    assert _result(0.2, 0.35, 800).planner_error == pytest.approx(0.25)
    assert _result(0.0, 0.01, 2000).planner_error == pytest.approx(-0.5)
    text = describe(_result(0.2, 0.35, 800))
    assert "does not hold" in text and "planner error +25.0%" in text and "1,000 images per CPU-second" in text


def test_run_check_measures_k_then_0_8_k_with_quotas_required(monkeypatch):
    seen = []

    def measure(sweep, hosts, cores, procs, manifest):
        seen.append((sweep.rate, sweep.need_quotas, hosts, cores, procs))
        rows = min(sweep.rate, 900.0 * cores)  # a host that makes 900 per core, against a plan of 1,000
        return Point(dataset="imagenet", hosts=1, cores_per_host=cores, procs=1, total_cores=cores, profile="x",
                     scale=1.0, accel_rate=sweep.rate, rows_per_s=rows, stall_fraction=1 - rows / sweep.rate,
                     cpu_seconds=cores * 20, cores_used=cores, bytes_received=0, wire_mb_per_s=0.0, elapsed_s=20,
                     startup_s=1)

    monkeypatch.setattr(plan_check, "measure_point", measure)
    result = plan_check.run_check(_cfg(cores=1.0))
    assert [s[3] for s in seen] == [1.0, pytest.approx(0.8)] and all(s[1] for s in seen)
    assert seen[0][0] == pytest.approx(1000 / 0.98)
    assert not result.holds and result.planner_error == pytest.approx(1000 / 900 - 1)
    assert result.as_dict()["planner_error"] == pytest.approx(1000 / 900 - 1)
