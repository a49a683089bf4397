"""stoker/planning.py: host cores, hosts and cost for a system, from a per-core rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stoker.planning import PlanInput, compare, describe, make_plan


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


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker", "plan", *args], capture_output=True, text=True, timeout=60)


def test_plan_takes_the_rate_of_the_transform_asked_for_and_says_how_to_measure_a_missing_one(tmp_path):
    """A transform of the team's own is slower than the MLPerf crop: its own rate makes its plan. The
    transform is named, not imported: the plan may be made where it is not installed."""
    cal = tmp_path / "cal.json"
    own = {"per_core_rate": 250, "version": "my-augment 2.0", "when": "2026-12-02 10:00"}
    cal.write_text(json.dumps({"imagenet": {"per_core_rate": 850}, "wikipedia": {"per_core_rate": 15_000},
                               "transforms": {'mine.aug:Aug {"size":176}': own}}))
    out = _plan("--calibration", str(cal), "--system", "dgx-a100", "--transform", "mine.aug:Aug",
                "--transform-params", '{ "size": 176 }', "--json", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    [plan] = json.loads((tmp_path / "plan.json").read_text())  # an image transform: imagenet alone
    # ceil(0.98 * 20,000 / 250) = 79 cores of the DGX's 128
    assert (plan["dataset"], plan["per_core_rate"], plan["cores_needed"]) == ("imagenet", 250, 79)
    assert plan["transform"] == 'mine.aug:Aug {"size":176}' and "calibrated with my-augment 2.0" in out.stdout
    assert "dgx-a100 / imagenet (transform mine.aug:Aug" in out.stdout
    default = _plan("--calibration", str(cal), "--system", "dgx-a100", "--dataset", "imagenet")
    assert "at 850 images/s per core" in default.stdout  # without --transform: the built-in train crop
    missing = _plan("--calibration", str(cal), "--transform", "mine.aug:Aug")
    assert missing.returncode == 2 and "has no rate for transform mine.aug:Aug (it has: mine.aug:Aug " \
        '{"size":176})' in missing.stderr and "`stoker calibrate --transform mine.aug:Aug`" in missing.stderr
    text = _plan("--calibration", str(cal), "--transform", "mine.aug:Aug", "--dataset", "wikipedia")
    assert text.returncode == 2 and "--transform names an image transform" in text.stderr


def test_plan_from_a_sweep_refuses_one_of_another_transform(tmp_path):
    from stoker.sweep import Point

    folder = tmp_path / "sweep"
    folder.mkdir()
    point = Point(dataset="imagenet", hosts=1, cores_per_host=1, procs=1, total_cores=1, profile="a100", scale=0.1,
                  accel_rate=250, rows_per_s=125, stall_fraction=0.5, cpu_seconds=10, cores_used=1, bytes_received=1,
                  wire_mb_per_s=1, elapsed_s=10, startup_s=1, transform="trivialaugment")
    (folder / "points.jsonl").write_text(json.dumps(point.__dict__) + "\n")
    refused = _plan("--sweep", str(folder), "--dataset", "imagenet")
    assert refused.returncode == 2 and f"{folder} swept transform trivialaugment, not train" in refused.stderr
    taken = _plan("--sweep", str(folder), "--transform", "trivialaugment", "--system", "a100")
    assert taken.returncode == 0 and "at 125 images/s per core" in taken.stdout


def test_plan_check_and_pack_are_refused_where_they_cannot_work(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"imagenet": {"per_core_rate": 850}, "wikipedia": {"per_core_rate": 15_000}}))
    for args, why in ((["--check"], "--check runs one job"),
                      (["--check", "--dataset", "imagenet", "--compare", "a100,h100"], "leave out --compare"),
                      (["--pack", "--dataset", "imagenet"], "--pack packs BERT rows"),
                      (["--dataset", "imagenet", "--check-cores", "1"], "belong to --check"),
                      (["--check", "--dataset", "imagenet", "--check-cores", str(os.cpu_count())],
                       "one kept for the consumer"),  # more than the lab can give a host
                      (["--check", "--dataset", "imagenet", "--check-cores", "0.0001"], "the lab can give a host"),
                      (["--dataset", "wikipedia", "--pack"], "has no wikipedia_packed rate"),
                      (["--dataset", "wikipedia", "--pack", "--check", "--per-core-rate", "900"],
                       "sequences per row from the calibration")):
        out = _plan("--calibration", str(cal), *args) if "--per-core-rate" not in args else _plan(*args)
        assert out.returncode != 0 and why in out.stderr, (args, out.stderr)
    # a packed rate is planned in sequences, as the accelerator counts them
    cal.write_text(json.dumps({"wikipedia_packed": {"per_core_rate": 20_000, "sequences_per_row": 1.3}}))
    out = _plan("--calibration", str(cal), "--dataset", "wikipedia", "--pack", "--system", "b200")
    assert out.returncode == 0 and "at 20,000 sequences/s per core" in out.stdout, out.stderr


def test_every_profile_names_its_source_and_what_decoding_on_the_accelerator_changes():
    from stoker.accel.backends.profiles import PROFILES
    from stoker.planning import SYSTEMS

    assert {"h100", "h200", "b200"} <= set(PROFILES) and {"h200", "b200"} <= set(SYSTEMS)
    for profile in PROFILES.values():
        assert profile.source and profile.decode_on_accelerator, profile.name
    assert all(PROFILES[name].rates for name in ("h100", "h200", "b200"))
    assert PROFILES["b200"].rates == {f: 2 * r for f, r in PROFILES["h100"].rates.items()}


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe", "cannot read it as a calibration"),
    (b"[1, 2]", "not list"),
    (b'{"imagenet": {"per_c', "not JSON"),
    (b'{"imagenet": {"per_core_rate": "fast"}}', "per_core_rate is 'fast', not a positive number"),
    (b'{"imagenet": {"per_core_rate": NaN}}', "per_core_rate is nan"),
    (b'{"imagenet": {"per_core_rate": -5}}', "per_core_rate is -5"),
    (b'{"transforms": [1], "imagenet": 3}', "per_core_rate is None"),
])
def test_a_broken_calibration_file_is_one_line_naming_it(tmp_path, content, why):
    cal = tmp_path / "cal.json"
    cal.write_bytes(content)
    out = _plan("--calibration", str(cal), "--dataset", "imagenet", "--system", "a100")
    assert out.returncode == 2 and str(cal) in out.stderr and why in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_plan_from_a_tiny_rate_prints_its_figures_readably_not_as_zero():
    text = describe(make_plan(PlanInput(system="dgx-a100", dataset="imagenet", per_core_rate=1e-9)))
    assert "at 1e-09 images/s per core" in text and "19,600,000,000,000 host core(s)" in text
    assert "+306,249,999,998 host server(s)" in text and " 0 images/s per core" not in text
