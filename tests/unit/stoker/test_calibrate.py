"""stoker/calibrate.py: per-core supply rates of this machine."""

from __future__ import annotations

import json


def test_calibrate_measures_both_datasets_on_units_that_span_shards(manifest, wiki_manifest, tmp_path):
    """`stoker calibrate` walks the plan's units, which may join two shards: both rates come out."""
    from stoker.calibrate import calibrate

    out = tmp_path / "calibration.json"
    result = calibrate(manifest.uri, wiki_manifest.uri, seconds=0.5, out=out)
    assert result["imagenet"]["per_core_rate"] > 0 and result["wikipedia"]["per_core_rate"] > 0
    assert json.loads(out.read_text())["imagenet"]["unit"] == "images/s"
