"""A job's first ask of a fleet: the planner's arithmetic on the device's rate and a calibrated core's."""

from __future__ import annotations

import json

import pytest

from stoker.accel.backends.accelerators import AccelSpec
from stoker.fleet_estimate import start_cores


def test_a_simulated_device_and_a_calibrated_core_give_the_estimate(tmp_path):
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"transforms": {"train": {"per_core_rate": 500.0, "clock": "cpu"}},
                                       "wikipedia": {"per_core_rate": 2000.0, "clock": "cpu"}}))
    spec = AccelSpec(kind="simulated", rate=1000.0)
    assert start_cores(spec, "imagenet", "train", "", 1, False, calibration) == pytest.approx(2.3)  # 2 cores x 1.15
    assert start_cores(spec, "imagenet", "train", "", 4, False, calibration) == pytest.approx(9.2)
    assert start_cores(spec, "wikipedia", "train", "", 1, False, calibration) == pytest.approx(0.575)


def test_without_a_known_rate_there_is_no_estimate(tmp_path):
    calibration = tmp_path / "cal.json"
    assert start_cores(AccelSpec(kind="simulated", rate=1000.0), "imagenet", "train", "", 1, False, calibration) is None
    calibration.write_text(json.dumps({"transforms": {}}))
    assert start_cores(AccelSpec(kind="simulated", rate=1000.0), "imagenet", "train", "", 1, False, calibration) is None
    assert start_cores(AccelSpec(kind="null"), "imagenet", "train", "", 1, False, calibration) is None
    calibration.write_text("not json")
    assert start_cores(AccelSpec(kind="simulated", rate=1000.0), "imagenet", "train", "", 1, False, calibration) is None
