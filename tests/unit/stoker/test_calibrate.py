"""stoker/calibrate.py: per-core supply rates of this machine, one per transform."""

from __future__ import annotations

import json
import platform
import random

import numpy as np
import pytest

from stoker.calibrate import (
    calibrate,
    calibrate_transform,
    calibration_notes,
    checked_rate,
    imagenet_job,
    images_in,
    sent_batches,
    sequences_in,
    transform_rate,
    wikipedia_job,
)
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


def test_the_stream_a_calibration_times_is_a_workers_batches_sent_to_a_sink(manifest, wiki_manifest):
    """sent_batches gives the batches the calibration counts, each sent over the wire before it is given:
    the images of the first unit are those the plan gives it, and BERT batches carry sequences."""
    job = imagenet_job(manifest)
    with sent_batches(manifest, job) as batches:
        first = next(batches)
    unit = next(iter(job.plan(manifest).units(0)))
    assert images_in(first) == job.batch_size and set(first.header.sample_ids) <= set(unit.sample_ids().tolist())
    with sent_batches(wiki_manifest, wikipedia_job(wiki_manifest, seq_len=128, pack=True), wire=False) as batches:
        packed = next(batches)
    assert sequences_in(packed) > packed.header.rows  # packed: more sequences than rows


def test_a_token_set_is_measured_in_tokens_with_its_tokenizer_alone_beside_it(tmp_path):
    """`stoker calibrate --tokens`: a real (small) tokens job read, packed and sent, and its tokenizer timed
    alone, both added to the file with the rest kept; each epoch reads the shards again, so the rate pays
    for reading them; `stoker plan --dataset tokens` plans from what was written."""
    import subprocess
    import sys

    from stoker.calibrate import TOKENIZE, TOKENS, calibrate_tokens
    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "set")
    out = tmp_path / "calibration.json"
    out.write_text(json.dumps({"wikipedia": {"per_core_rate": 9.0, "clock": "cpu"}}))
    calibrate_tokens(result.manifest.uri, seconds=0.3, out=out)
    written = json.loads(out.read_text())
    tokens, tokenize = written[TOKENS], written[TOKENIZE]
    assert written["wikipedia"]["per_core_rate"] == 9.0
    assert (tokens["unit"], tokens["clock"], tokens["seq_len"], tokens["mode"]) == (
        "tokens per CPU-second", "cpu", 1024, "packed")
    assert tokens["per_core_rate"] > 0 and "framed and sent over CURVE" in tokens["what"]
    shard_bytes = sum(s.num_bytes for s in result.manifest.shards)
    assert tokens["bytes_per_token"] == pytest.approx(shard_bytes / result.tokens)
    assert 0 < tokens["fill"] <= 1 and tokens["machine"] == machine_kind()
    assert tokenize["per_core_rate"] > 0 and tokenize["what"].startswith("tokenize only (not a job's rate)")
    assert tokenize["fingerprint"] == result.manifest.tokens["fingerprint"]
    plan = subprocess.run([sys.executable, "-m", "stoker", "plan", "--dataset", "tokens", "--calibration", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0 and "tokens per CPU-second per host core" in plan.stdout, plan.stderr
    assert "tokenizing online instead" in plan.stdout



def test_the_default_token_set_is_the_world_english_bible_cut_by_the_shipped_bpe(tmp_path):
    """What plain `stoker calibrate` times a tokens job on: real text and a real tokenizer, made once."""
    from stoker.datasets import default_tokens
    from stoker.pipeline.store.shards import Manifest
    from stoker.pipeline.text.shipped import BIBLE_CHAPTERS, BPE_FINGERPRINT
    from stoker.pipeline.text.token_cost import INT32_BYTES, bytes_per_token

    path = default_tokens(root=tmp_path, progress=False)
    manifest = Manifest.load(path)
    assert (manifest.kind, manifest.num_samples, manifest.tokens["fingerprint"]) == ("tokens", BIBLE_CHAPTERS,
                                                                                     BPE_FINGERPRINT)
    assert len(manifest.shards) > 1 and 0 < bytes_per_token(manifest) < INT32_BYTES
    assert default_tokens(root=tmp_path, progress=False) == path  # made once, then reused
