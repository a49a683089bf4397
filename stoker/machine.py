"""What machine a figure was measured on: a per-core rate holds for one CPU kind, not for another."""

from __future__ import annotations

import platform
from pathlib import Path


def _cpuinfo() -> dict[str, str]:
    """The first core's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def machine_kind() -> str:
    """Architecture and CPU model with its family and model numbers (a cloud VM's model name is often
    bare, "AMD EPYC"): two hosts of one kind give one string; the clock, which varies, is left out."""
    fields = _cpuinfo()
    if "model name" not in fields:
        return f"{platform.machine()} {platform.processor() or ''}".strip()
    return (f"{platform.machine()} {fields['model name']} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')})")


def cpu_model() -> str:
    """The CPU as the guest sees it, for a results file: model name, family/model/stepping, clock now."""
    fields = _cpuinfo()
    if not fields:
        return platform.processor() or platform.machine()
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}, stepping {fields.get('stepping', '?')}, {fields.get('cpu MHz', '?')} MHz)")
