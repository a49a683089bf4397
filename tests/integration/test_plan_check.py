"""`stoker plan --check` for real: one lab host under a CPU quota of the plan's cores, then 80% of it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stoker.lab.system import can_use_namespaces


@pytest.mark.skipif(can_use_namespaces() is not None, reason=f"needs network namespaces: {can_use_namespaces()}")
def test_a_plan_far_too_optimistic_is_caught_by_its_check(manifest, tmp_path, monkeypatch):
    """A per-core rate no core here reaches (20,000 images per CPU-second of decode, crop and resize):
    the lab device is sized so that plan says half a core, the host under that quota cannot keep up,
    and the check says the prediction does not hold, with the error of the rate it was given."""
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    out = tmp_path / "plan.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "plan", "--dataset", "imagenet", "--system", "a100",
                             "--per-core-rate", "20000", "--check", "--check-cores", "0.5", "--check-seconds", "4",
                             "--data", manifest.uri, "--json", str(out)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    check = json.loads(out.read_text())[0]["check"]
    at_k, short = check["points"]
    assert (at_k["cores"], short["cores"]) == (0.5, 0.4)
    assert check["device_rate"] == pytest.approx(0.5 * 20_000 / 0.98)
    assert at_k["measured_stall"] > 0.3 and short["measured_stall"] > at_k["measured_stall"] - 0.05
    assert not check["holds"] and check["planner_error"] > 1.0
    assert check["planner_error"] == pytest.approx(20_000 / short["per_core_rate"] - 1)
    # the quota held the host: what it made per core of quota is a real rate, far below the plan's
    assert 200 < short["per_core_rate"] < 10_000
    assert "the prediction does not hold" in result.stdout and "planner error +" in result.stdout
    assert not (tmp_path / "lab" / "state.json").exists()  # the lab is down again
