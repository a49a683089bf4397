"""stoker/sweep.py: the ratio sweep resumes, and writes its table and plots."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stoker.sweep import (
    Point,
    SweepConfig,
    default_out,
    knee,
    load_points,
    markdown,
    per_core_rate,
    run_sweep,
    write_outputs,
)


def _fake(cfg: SweepConfig, hosts: int, cores: float, procs: int, manifest: str) -> Point:
    """A host-bound line at 800 rows/s per core against a 1,000 rows/s device."""
    total = hosts * cores
    rate = min(1000.0, 800.0 * total)
    return Point(dataset=cfg.dataset, hosts=hosts, cores_per_host=cores, procs=procs, total_cores=total,
                 profile=cfg.profile, scale=0.1, accel_rate=1000.0, rows_per_s=rate, stall_fraction=1 - rate / 1000,
                 cpu_seconds=total * 10, cores_used=total, bytes_received=int(rate * 1e5), wire_mb_per_s=rate / 10,
                 elapsed_s=10, startup_s=1, stage_seconds={"decode": 5.0, "stall": 1.0}, transform=cfg.transform,
                 transform_params=cfg.transform_params)


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


def test_a_sweep_of_another_transform_tells_its_job_and_keeps_to_a_folder_of_its_own(tmp_path):
    """The transform goes to the consumer's `stoker train` (which hands it to every worker), is recorded
    on every point and in the table, and a resume never mixes points of two transforms."""
    cfg = SweepConfig(out=tmp_path, hosts=(1,), cores_per_host=(0.5,), transform="trivialaugment",
                      transform_params='{"size":176}')
    assert cfg.transform_args == ["--transform", "trivialaugment", "--transform-params", '{"size":176}']
    assert SweepConfig(out=tmp_path).transform_args == []
    points = run_sweep(cfg, "unused", progress=False, measure=_fake)
    assert [p.transform_named for p in load_points(tmp_path)] == ['trivialaugment {"size":176}']
    assert markdown(points).startswith('Sweep of imagenet, transform trivialaugment {"size":176} against')
    with pytest.raises(ValueError, match="holds points of transform trivialaugment .*another --out"):
        run_sweep(replace(cfg, transform="train", transform_params=""), "unused", progress=False, measure=_fake)
    assert default_out("imagenet") == Path("sweeps/imagenet")
    assert default_out("imagenet", "pkg.mod:Aug", '{"size":176}') == Path("sweeps/imagenet-pkg.mod-Aug-size-176")
    with pytest.raises(ValueError, match="a wikipedia sweep has none"):
        SweepConfig(out=tmp_path, dataset="wikipedia", transform="trivialaugment")


def test_points_written_before_transforms_were_named_are_the_train_crops(tmp_path):
    row = asdict(_fake(SweepConfig(out=tmp_path), 1, 0.5, 1, "unused"))
    del row["transform"], row["transform_params"]
    (tmp_path / "points.jsonl").write_text(json.dumps(row) + "\n")
    assert load_points(tmp_path)[0].transform_named == "train"


def test_a_disturbed_point_is_marked_and_left_out_of_the_knee_and_the_rate(tmp_path):
    cfg = SweepConfig(out=tmp_path / "imagenet", hosts=(1, 2), cores_per_host=(0.5, 1.0))
    points = run_sweep(cfg, "unused", progress=False, measure=_fake)
    # the 2-core point waited 35% of its time for a core its quota allowed: it measured the neighbours
    points = [replace(p, contention=0.35) if p.total_cores == 2.0 else replace(p, contention=0.01) for p in points]
    assert [p.disturbed for p in points] == [False, False, False, True]
    assert knee(points) is None  # the only fed point was disturbed
    assert per_core_rate([replace(p, rows_per_s=50.0, contention=0.5) for p in points[:1]] + points[1:3]) == \
        pytest.approx(800)  # the disturbed 0.5-core point's 100 rows/s per core is not averaged in
    text = markdown(points)
    assert "(disturbed: 35% wait for a core)" in text and "1 point(s) marked disturbed" in text


def test_contention_is_the_wait_no_quota_explains():
    from stoker.sweep import contention_of

    assert contention_of({"cpu": 6.0, "cpu_wait": 4.0, "throttled_wait": 3.0}) == pytest.approx(0.1)
    assert contention_of({"cpu": 6.0, "cpu_wait": 4.0}) == pytest.approx(0.4)
    assert contention_of({"cpu": 6.0}) is None  # not measured: no schedstat on this host


def test_the_time_to_train_plot_puts_both_models_side_by_side(tmp_path):
    from stoker.sweep import TIME_TO_TRAIN_PLOT, model_time_to_train_h

    for dataset in ("imagenet", "wikipedia"):
        cfg = SweepConfig(out=tmp_path / dataset, dataset=dataset, hosts=(1, 2), cores_per_host=(0.5, 1.0))
        paths = write_outputs(run_sweep(cfg, "unused", progress=False, measure=_fake), cfg.out)
    assert paths[-1] == tmp_path / TIME_TO_TRAIN_PLOT and paths[-1].read_bytes()[:4] == b"\x89PNG"
    # the model: host-bound below the knee (time falls as 1 / cores), flat at the device's rate above it
    fed, half = (model_time_to_train_h("imagenet", 10_000, 800, c) for c in (20, 6.25))
    assert fed == pytest.approx(model_time_to_train_h("imagenet", 10_000, 800, 40))
    assert half == pytest.approx(2 * fed)
    assert model_time_to_train_h("wikipedia", 1000, 100, 20, samples_per_row=1.25) == pytest.approx(
        model_time_to_train_h("wikipedia", 1000, 100, 20) / 1.25)
