"""One real sweep point on the emulated cluster (stoker/lab)."""

from __future__ import annotations

import os
from pathlib import Path

from stoker.sweep import SweepConfig, measure_point


def test_one_real_sweep_point_on_the_lab(manifest, tmp_path, monkeypatch):
    """Namespaces and quotas where they work (root), loopback otherwise: the numbers come from a real job."""
    monkeypatch.setenv("STOKER_LAB_DIR", str(tmp_path / "lab"))
    cfg = SweepConfig(out=tmp_path / "out", hosts=(1,), cores_per_host=(0.5,), profile="a100", scale=0.1,
                      seconds=3.0, batch_size=16)
    point = measure_point(cfg, 1, 0.5, 1, manifest.uri)
    assert point.accel_rate == 250 and 0 < point.rows_per_s <= 260
    assert point.bytes_received > 0 and point.wire_mb_per_s > 0
    assert 0 < point.cores_used <= (0.6 if os.geteuid() == 0 else 1.2)  # as root a quota holds it to half a core
    assert point.stage_seconds["decode"] > 0
    assert not Path(tmp_path / "lab" / "state.json").exists()  # the lab is down again
