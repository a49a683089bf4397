"""stoker/machine.py: the machine kind a calibration names, and the CPU a results file records."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from stoker import machine


def test_the_kind_names_the_architecture_and_cpu_model_but_not_the_clock_that_varies():
    kind = machine.machine_kind()
    assert kind.startswith(platform.machine()) and kind == machine.machine_kind()
    info = Path("/proc/cpuinfo").read_text()
    if "model name" in info:
        model = next(line.partition(":")[2].strip() for line in info.splitlines() if line.startswith("model name"))
        assert model in kind and "MHz" not in kind


def test_a_host_without_cpuinfo_is_named_by_its_architecture(monkeypatch):
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {})
    assert machine.machine_kind().startswith(platform.machine())
    assert machine.cpu_model()  # never empty: the processor or the architecture


def test_two_cpus_of_one_name_but_other_models_are_two_kinds(monkeypatch):
    fields = {"model name": "AMD EPYC", "cpu family": "25", "model": "1", "cpu MHz": "2000.0"}
    monkeypatch.setattr(machine, "_cpuinfo", lambda: dict(fields))
    first = machine.machine_kind()
    fields.update({"model": "17", "cpu MHz": "3100.0"})
    assert machine.machine_kind() != first and "2000" not in first
    assert "3100.0 MHz" in machine.cpu_model()


@pytest.mark.parametrize("name", ["machine_kind", "cpu_model"])
def test_each_is_one_line(name):
    assert "\n" not in getattr(machine, name)()
