"""stoker/sweep.py: the ratio sweep resumes, and writes its table and plots."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from stoker.sweep import Point, SweepConfig, knee, load_points, per_core_rate, run_sweep, write_outputs


def _fake(cfg: SweepConfig, hosts: int, cores: float, procs: int, manifest: str) -> Point:
    """A host-bound line at 800 rows/s per core against a 1,000 rows/s device."""
    total = hosts * cores
    rate = min(1000.0, 800.0 * total)
    return Point(dataset=cfg.dataset, hosts=hosts, cores_per_host=cores, procs=procs, total_cores=total,
                 profile=cfg.profile, scale=0.1, accel_rate=1000.0, rows_per_s=rate, stall_fraction=1 - rate / 1000,
                 cpu_seconds=total * 10, cores_used=total, bytes_received=int(rate * 1e5), wire_mb_per_s=rate / 10,
                 elapsed_s=10, startup_s=1, stage_seconds={"decode": 5.0, "stall": 1.0})


def test_sweep_resumes_after_an_interruption_and_writes_its_table_and_plots(tmp_path):
    cfg = SweepConfig(out=tmp_path, hosts=(1, 2), cores_per_host=(0.5, 1.0))
    calls = []

    def interrupted(*args):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(args[1:4])
        return _fake(*args)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, "unused", progress=False, measure=interrupted)
    assert len(load_points(tmp_path)) == 2
    resumed = []
    points = run_sweep(cfg, "unused", progress=False, measure=lambda *a: resumed.append(a[1:4]) or _fake(*a))
    assert len(resumed) == 2 and not set(resumed) & set(calls)  # only the missing points were measured
    assert [p.total_cores for p in points] == [0.5, 1.0, 1.0, 2.0]
    assert knee(points).total_cores == 2.0  # 1.0 core gives 800 of 1,000 rows/s: 20% stall
    assert per_core_rate(points) == pytest.approx(800)
    paths = write_outputs(points, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    table = pq.read_table(tmp_path / "sweep.parquet").to_pydict()
    assert table["stall_fraction"] == pytest.approx([0.6, 0.2, 0.2, 0.0]) and table["stage_decode_s"] == [5.0] * 4
    assert "**knee**" in (tmp_path / "sweep.md").read_text()
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
