"""`stoker plan` against hand-computed cases, and `stoker sweep`'s bookkeeping, outputs and one real point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stoker.planning import PlanInput, compare, make_plan
from stoker.sweep import Point, SweepConfig, knee, load_points, measure_point, per_core_rate, run_sweep, write_outputs


def test_a_dgx_a100_needs_24_of_its_own_cores_for_resnet50():
    # 8 x 2,500 = 20,000 img/s; ceil(0.98 * 20,000 / 850) = ceil(23.06) = 24 cores, inside its 128.
    plan = make_plan(PlanInput(system="dgx-a100", dataset="imagenet", per_core_rate=850))
    assert (plan.accel_rate, plan.cores_needed, plan.extra_hosts) == (20_000, 24, 0)
    assert plan.delivered_rate == 20_000 and plan.stall_fraction == 0
    assert plan.time_to_train_h == pytest.approx(1_281_167 * 40 / 20_000 / 3600)  # 0.712 h
    assert plan.price == 300_000 and plan.samples_per_s_per_kdollar == pytest.approx(66.667, abs=1e-3)


def test_an_ipu_pod16_buys_one_host_and_stalls_just_under_two_percent():
    # ceil(0.98 * 26,000 / 850) = ceil(29.98) = 30 cores: one 64-core host; 30 x 850 = 25,500 img/s.
    plan = make_plan(PlanInput(system="ipu-pod16", dataset="imagenet", per_core_rate=850, host_price=25_000))
    assert (plan.cores_needed, plan.extra_hosts, plan.delivered_rate) == (30, 1, 25_500)
    assert plan.stall_fraction == pytest.approx(1 - 25_500 / 26_000)  # 1.92%
    assert plan.price == 174_995 and plan.samples_per_s_per_kdollar == pytest.approx(145.718, abs=1e-3)
    dgx = make_plan(PlanInput(system="dgx-a100", dataset="imagenet", per_core_rate=850))
    text = compare([plan, dgx])
    assert "2.19x" in text and "published (Graphcore): 1.6x" in text


def test_hosts_round_up_and_an_unpriced_system_has_no_cost():
    # ceil(0.98 * 68,000 / 500) = ceil(133.28) = 134 cores in 32-core hosts: 5 hosts.
    plan = make_plan(PlanInput(system="ipu-pod64", dataset="imagenet", per_core_rate=500, cores_per_host=32))
    assert (plan.cores_needed, plan.extra_hosts, plan.price, plan.samples_per_s_per_kdollar) == (134, 5, None, None)
    bert = make_plan(PlanInput(system="ipu-pod16", dataset="wikipedia", per_core_rate=1_000, samples=1_300 * 3600))
    assert bert.cores_needed == 2 and bert.time_to_train_h == pytest.approx(1.0)  # ceil(1.274) cores, 1 hour
    with pytest.raises(ValueError, match="per-core rate"):
        make_plan(PlanInput(system="a100", dataset="imagenet", per_core_rate=0))


def test_plan_cli_reads_a_calibration(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"imagenet": {"per_core_rate": 850}, "wikipedia": {"per_core_rate": 15_000}}))
    out = subprocess.run([sys.executable, "-m", "stoker", "plan", "--calibration", str(cal), "--compare",
                          "ipu-pod16,dgx-a100", "--json", str(tmp_path / "plan.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "imagenet: ipu-pod16 gives 2.19x" in out.stdout and "wikipedia: ipu-pod16 gives" in out.stdout
    plans = json.loads((tmp_path / "plan.json").read_text())
    assert [(p["system"], p["dataset"]) for p in plans] == [("ipu-pod16", "imagenet"), ("dgx-a100", "imagenet"),
                                                           ("ipu-pod16", "wikipedia"), ("dgx-a100", "wikipedia")]


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


def test_calibrate_measures_both_datasets_on_units_that_span_shards(manifest, wiki_manifest, tmp_path):
    """`stoker calibrate` walks the plan's units, which may join two shards: both rates come out."""
    from stoker.calibrate import calibrate

    out = tmp_path / "calibration.json"
    result = calibrate(manifest.uri, wiki_manifest.uri, seconds=0.5, out=out)
    assert result["imagenet"]["per_core_rate"] > 0 and result["wikipedia"]["per_core_rate"] > 0
    assert json.loads(out.read_text())["imagenet"]["unit"] == "images/s"
