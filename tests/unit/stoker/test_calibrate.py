"""stoker/calibrate.py: per-core supply rates of this machine, one per transform."""

from __future__ import annotations

import json
import platform
import random

import numpy as np
import pytest

from stoker.calibrate import calibrate, calibrate_transform, calibration_notes, checked_rate, transform_rate
from stoker.machine import machine_kind
from stoker.pipeline.transforms import Output
from stoker.planning import transform_key


class Half:
    """A crop-first transform with a parameter: the MLPerf eval crop at half its side."""

    takes = "crop"

    def __init__(self, side: int = 112) -> None:
        from stoker.pipeline.images.augment import EvalTransform

        self.crop_size, self._eval = side, EvalTransform(size=side)
        self.outputs = {"image": Output("uint8", (side, side, 3))}

    def crop(self, width: int, height: int, rng: random.Random):
        return self._eval.crop(width, height, rng)

    def __call__(self, sample, rng, pixels: np.ndarray):
        return {"image": pixels}


HALF = f"{__name__}:Half"


def test_calibrate_measures_both_datasets_on_units_that_span_shards(manifest, wiki_manifest, tmp_path):
    """`stoker calibrate` walks the plan's units, which may join two shards: both rates come out, the
    image rate named as the built-in train transform, and rates of other transforms already in the
    file are kept."""
    out = tmp_path / "calibration.json"
    out.write_text(json.dumps({"transforms": {"eval": {"per_core_rate": 5.0}}}))
    result = calibrate(manifest.uri, wiki_manifest.uri, seconds=0.5, out=out)
    assert result["imagenet"]["per_core_rate"] > 0 and result["wikipedia"]["per_core_rate"] > 0
    written = json.loads(out.read_text())
    assert (written["imagenet"]["unit"], written["imagenet"]["clock"]) == ("images per CPU-second", "cpu")
    assert (written["imagenet"]["transform"], written["imagenet"]["params"]) == ("train", "")
    assert written["imagenet"]["version"].startswith("stoker ")
    assert set(written["transforms"]) == {"eval", "train"} and written["transforms"]["eval"]["per_core_rate"] == 5.0
    assert transform_rate(written, "train")["per_core_rate"] == written["imagenet"]["per_core_rate"]


def test_a_transform_is_measured_with_its_name_parameters_and_version_and_added_to_the_file(manifest, tmp_path):
    out = tmp_path / "calibration.json"
    out.write_text(json.dumps({"imagenet": {"per_core_rate": 900.0}, "wikipedia": {"per_core_rate": 9000.0}}))
    entry = calibrate_transform(manifest.uri, HALF, '{ "side": 64 }', seconds=0.3, out=out)
    assert entry["per_core_rate"] > 0 and entry["params"] == '{"side":64}' and entry["data"] == manifest.uri
    assert entry["version"].startswith(f"{__name__} sha256:")  # an uninstalled module: its source's digest
    assert "uint8[64, 64, 3]" in entry["what"]
    written = json.loads(out.read_text())
    assert written["imagenet"]["per_core_rate"] == 900.0  # the other rates stay
    assert transform_rate(written, HALF, '{"side": 64}') == entry
    assert transform_rate(written, "train")["per_core_rate"] == 900.0  # a file from before per-transform rates
    with pytest.raises(ValueError, match=r"no rate for transform .*:Half \{\"side\":32\}.*"
                                         r"stoker calibrate --transform .*:Half --transform-params '\{\"side\":32\}'"):
        transform_rate(written, HALF, '{"side":32}')


def test_parameters_name_a_rate_whatever_their_spelling():
    assert transform_key("t", '{"b": 1, "a": 2}') == transform_key("t", '{"a":2,"b":1}') == 't {"a":2,"b":1}'
    assert transform_key("train") == transform_key("train", "") == "train"


def test_a_plan_says_when_its_calibration_is_another_machines_or_by_the_wall_clock():
    here = calibration_notes({"per_core_rate": 900.0, "clock": "cpu", "machine": machine_kind()}, {}, "cal.json")
    assert here == []
    elsewhere = calibration_notes({"per_core_rate": 900.0, "clock": "cpu"}, {"machine": "aarch64 neoverse-v2"},
                                  "cal.json")
    assert len(elsewhere) == 1 and "measured on aarch64 neoverse-v2, not on this machine" in elsewhere[0]
    old = calibration_notes({"per_core_rate": 900.0, "machine": machine_kind()}, {}, "cal.json")
    assert len(old) == 1 and "wall clock" in old[0]
    # the same architecture with another CPU is another kind; an architecture alone names no kind
    other_cpu = calibration_notes({"per_core_rate": 900.0, "clock": "cpu"},
                                  {"machine": f"{platform.machine()} Some Other CPU (family 6, model 1)"}, "cal.json")
    assert len(other_cpu) == 1 and "not on this machine" in other_cpu[0]
    bare = calibration_notes({"per_core_rate": 900.0, "clock": "cpu", "machine": platform.machine()}, {}, "cal.json")
    assert len(bare) == 1 and "only by its architecture" in bare[0]


def test_a_rate_of_an_unknown_clock_is_refused_not_read_as_the_wall_clock():
    assert checked_rate({"per_core_rate": 900.0, "clock": "cpu"}, "imagenet", "cal.json") == 900.0
    assert checked_rate({"per_core_rate": 900.0}, "imagenet", "cal.json") == 900.0  # an older wall-clock rate
    with pytest.raises(ValueError, match="cal.json: imagenet's clock is 'gpu', neither"):
        checked_rate({"per_core_rate": 900.0, "clock": "gpu"}, "imagenet", "cal.json")


def test_an_out_that_cannot_be_written_is_refused_before_anything_is_measured(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr("stoker.calibrate._pinned", lambda measure: measured.append(1))
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="cannot write the calibration to .*cal.json: a file stands where its folder"):
        calibrate_transform("unused", "train", out=tmp_path / "file" / "cal.json")
    with pytest.raises(ValueError, match="cannot read it as a calibration"):
        calibrate_transform("unused", "train", out=tmp_path)
    assert measured == []
