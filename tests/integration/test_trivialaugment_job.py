"""The TrivialAugment example (examples/trivialaugment) in a real `stoker run`: imported by its path on
the worker daemons (not installed), every sample delivered at 96 px, and the closing line gives the
host cores the transform needs per accelerator at the run's own rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.accel.cost import cores_text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trivialaugment"
NAME = "stoker_trivialaugment:TrivialAugmentWide"


def test_a_run_with_the_example_ends_with_the_cores_it_needs(manifest, tmp_path):
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--transform", NAME,
                             "--transform-params", '{"size": 96}', "--batch-size", "16", "--json", str(out),
                             "--no-progress", "--data-bind", "tcp://127.0.0.1:0", "--control-bind",
                             "tcp://127.0.0.1:0", "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert summary["samples"] == summary["unique_samples"] == manifest.num_samples
    assert summary["bytes_received"] >= manifest.num_samples * 96 * 96 * 3  # 96 px images crossed the wire
    cores = summary["cores"]
    assert cores["transform"] == f'{NAME} {{"size": 96}}' and cores["accelerator_rate"] == 2500
    assert cores["cores_needed"] == pytest.approx(2500 / cores["per_core_rate"])
    assert result.stdout.strip().splitlines()[-2].startswith(
        f"host cores needed for a full-size a100: {cores_text(cores['cores_needed'])} (2,500 images/s over "
        f"{cores['per_core_rate']:,.0f} images per CPU-second")
    assert result.stdout.strip().splitlines()[-2].endswith(f'; transform {NAME} {{"size": 96}})')
