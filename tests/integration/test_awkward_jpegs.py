"""Awkward but valid JPEGs through both decode placements, several epochs: nothing dropped, no crash.

EXIF-rotated images (orientations 2-8), images of 1 to 12 pixels a side, greyscale, CMYK,
progressive and unusual chroma subsampling. Host decoding accepts all of them; decoding on
the accelerator (DALI on this CPU) must too: it ignores the orientation as the host does,
gets crops clamped to the stored size, and falls back to the host decoder for anything DALI
still refuses. Each run is a real `stoker run` process, so a crash inside DALI shows as one.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from stoker.accel.jpeg_decode import DaliJpegDecoder, _reason
from stoker.pipeline.augment import TrainTransform, decode_augment
from stoker.pipeline.batching import ShipEncoded
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.shards import ShardReader
from tests.awkward import write_awkward_set
from tests.helpers import sample_of

EPOCHS = 3


@pytest.fixture(scope="module")
def awkward(tmp_path_factory):
    raw = tmp_path_factory.mktemp("awkward-raw")
    count = write_awkward_set(raw)
    result = prepare_imagenet(raw, tmp_path_factory.mktemp("awkward-shards"),
                              PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2))
    assert result.skipped == [] and result.manifest.num_samples == count  # all valid: the host decodes each
    return result.manifest


@pytest.mark.parametrize("decode_on,transform", [("host", "train"), ("accelerator", "train"),
                                                 ("accelerator", "eval")])
def test_every_awkward_image_is_delivered_every_epoch(awkward, tmp_path, decode_on, transform):
    out = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", awkward.uri, "--epochs", str(EPOCHS),
                             "--batch-size", "16", "--image-size", "64", "--decode-on", decode_on, "--accel", "null",
                             "--transform", transform, "--no-progress", "--json", str(out),
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())
    expected = EPOCHS * awkward.num_samples
    assert summary["skipped"] == [] and summary["frames_dropped"] == {}
    assert summary["samples"] == summary["unique_samples"] == summary["rows"] == expected
    assert summary["per_epoch_unique"] == [awkward.num_samples] * EPOCHS


def test_dali_ignores_the_exif_orientation_as_the_host_does(awkward):
    """Rotated images decode to the host's pixels for the same crop (the stored orientation)."""
    transform = TrainTransform(size=48)
    work = ShipEncoded(transform)
    reader = ShardReader(awkward.shard_uri(0))
    rows = [r for r in range(len(reader)) if len(reader.jpeg(r)) > 2000][:16]  # the larger, rotated ones
    tensors = work.tensors([work.prepare(sample_of(reader, r), sample_random(3, 0, r)).payload for r in rows])
    ends = tensors["jpeg_end"]
    jpegs = [tensors["jpeg"][s:e] for s, e in zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)]
    decoder = DaliJpegDecoder(48, 32)
    outputs, failed = decoder.decode(jpegs, tensors["crop"], tensors["flip"])
    assert failed == {} and decoder.fallbacks == 0 and len(outputs) == 1  # one batch: DALI took them all
    images = np.asarray(outputs[0].as_tensor())
    for i, r in enumerate(rows):
        host = decode_augment(bytes(reader.jpeg(r)), transform, sample_random(3, 0, r), "full").pixels
        assert np.abs(images[i].astype(int) - host).mean() < 2.0, f"row {r} differs from the host decode"


def test_a_dali_error_is_reported_in_its_own_words():
    error = RuntimeError("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.decoders.image_slice`,\n"
                         "which was used in the pipeline definition with the following traceback:\n\n"
                         "encountered:\n\nThe cropping window [16..199, 23..232] is not valid for image dimensions "
                         "[300 x 200]\nC++ context: [crop_window.h:91]\nCurrent pipeline object is no longer valid.")
    reason = _reason(error)
    assert "cropping window [16..199, 23..232] is not valid" in reason and "no longer valid" not in reason


class RefusesTheFirst(DaliJpegDecoder):
    """DALI standing in for a GPU decoder that refuses one image (as nvJPEG may a tiny one)."""

    def __init__(self, refused: np.ndarray, *args) -> None:
        super().__init__(*args)
        self.refused = refused

    def _run(self, jpegs, crops, flips):
        if any(j is self.refused for j in jpegs):
            raise RuntimeError("Critical error in pipeline:\nencountered:\n\nnvImageCodec failure: '#2'")
        return super()._run(jpegs, crops, flips)


def test_an_image_dali_refuses_is_decoded_on_the_host_instead(awkward):
    transform = TrainTransform(size=32)
    work = ShipEncoded(transform)
    reader = ShardReader(awkward.shard_uri(0))
    rows = list(range(6))
    tensors = work.tensors([work.prepare(sample_of(reader, r), sample_random(1, 0, r)).payload for r in rows])
    ends = tensors["jpeg_end"]
    jpegs = [tensors["jpeg"][s:e] for s, e in zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)]
    decoder = RefusesTheFirst(jpegs[2], 32, 8)
    outputs, failed = decoder.decode(jpegs, tensors["crop"], tensors["flip"])
    assert failed == {} and decoder.fallbacks == 1 and len(outputs) == len(rows)  # retried one by one
    host = decode_augment(bytes(reader.jpeg(2)), transform, sample_random(1, 0, 2), "full").pixels
    assert np.abs(outputs[2][0].astype(int) - host).mean() < 1.0
