"""Awkward but valid JPEGs through both decode placements, several epochs: nothing dropped, no crash.
And corrupt ones: skipped and counted with libjpeg's words, or trained on with --corrupt-jpegs keep.

EXIF-rotated images (orientations 2-8), images of 1 to 12 pixels a side, greyscale, CMYK,
progressive and unusual chroma subsampling. Host decoding accepts all of them; decoding on
the accelerator (DALI on this CPU) must too: it ignores the orientation as the host does,
gets crops clamped to the stored size, and falls back to the host decoder for anything DALI
still refuses. Each run is a real `stoker run` process, so a crash inside DALI shows as one.
JPEGs whose header is valid and whose scan is garbled or cut short (tests.corrupt_jpegs) are
skipped by the worker processes in every epoch, on both placements, each with what libjpeg said.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from stoker.accel.jpeg_decode import DaliJpegDecoder, _reason
from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.images.batching import ShipEncoded
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from stoker.pipeline.transforms import Sample
from tests.awkward import encode, write_awkward_set
from tests.corrupt_jpegs import garbled, truncated, without_eoi
from tests.helpers import sample_of
from tests.shard_edits import reshard

EPOCHS = 3


@pytest.fixture(scope="module")
def awkward(tmp_path_factory):
    raw = tmp_path_factory.mktemp("awkward-raw")
    count = write_awkward_set(raw)
    result = prepare_imagenet(raw, tmp_path_factory.mktemp("awkward-shards"),
                              PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2))
    assert result.skipped == [] and result.manifest.num_samples == count  # all valid: the host decodes each
    return result.manifest


def _run(manifest_uri: str, out, *flags: str) -> dict:
    """A real `stoker run` of EPOCHS epochs (its worker processes decode); its summary."""
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest_uri, "--epochs", str(EPOCHS),
                             "--batch-size", "16", "--image-size", "64", "--accel", "null", *flags, "--no-progress",
                             "--json", str(out), "--data-bind", "tcp://127.0.0.1:0", "--control-bind",
                             "tcp://127.0.0.1:0", "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("decode_on,transform", [("host", "train"), ("accelerator", "train"),
                                                 ("accelerator", "eval")])
def test_every_awkward_image_is_delivered_every_epoch(awkward, tmp_path, decode_on, transform):
    summary = _run(awkward.uri, tmp_path / "summary.json", "--decode-on", decode_on, "--transform", transform)
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


BROKEN = {"garbled": garbled, "truncated": truncated, "without EOI": without_eoi}
WORDS = {"garbled": "corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: ",
         "truncated": "truncated JPEG: libjpeg warned 'Premature end of JPEG file'",
         "without EOI": "truncated JPEG: libjpeg warned 'Premature end of JPEG file'"}


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    """40 pillow-simd JPEGs through `stoker prepare imagenet`, then four of them garbled in the middle of
    their scan, one cut inside it and one without its EOI marker, stored as prepare stores a file it
    cannot transcode (as it was, no restart index; prepare itself skips a cut one pillow-simd fails on).
    Returns the manifest and key -> how that sample is broken."""
    raw = tmp_path_factory.mktemp("corrupt-raw")
    originals = {}
    for i in range(40):
        folder = raw / "train" / ("n01440764", "n01443537")[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        originals[f"img_{i:02d}"] = encode(320 - 8 * (i % 5), 240, seed=100 + i)
        (folder / f"img_{i:02d}.JPEG").write_bytes(originals[f"img_{i:02d}"])
    prepared = prepare_imagenet(raw, tmp_path_factory.mktemp("corrupt-prepared"),
                                PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2)).manifest
    victims = dict(zip([f"img_{i:02d}" for i in (3, 10, 17, 24, 31, 38)],
                       ["garbled"] * 4 + ["truncated", "without EOI"], strict=True))

    def break_some(_, rows):
        return [(key, label, BROKEN[victims[key]](originals[key]), None) if key in victims else
                (key, label, jpeg, restarts) for key, label, jpeg, restarts in rows]

    return reshard(prepared, tmp_path_factory.mktemp("corrupt-shards"), 64, break_some), victims


@pytest.mark.parametrize("decode_on", ["host", "accelerator"])
def test_corrupt_jpegs_are_skipped_every_epoch_and_counted_with_libjpegs_words(corrupt, tmp_path, decode_on):
    """Today the garbled ones (and the one without EOI, decoded here) train as grey or smeared pixels."""
    manifest, victims = corrupt
    summary = _run(manifest.uri, tmp_path / "summary.json", "--decode-on", decode_on)
    skipped = summary["skipped"]
    assert sorted((s["epoch"], s["key"]) for s in skipped) == sorted((e, k) for e in range(EPOCHS) for k in victims)
    for s in skipped:
        assert s["reason"].startswith(WORDS[victims[s["key"]]]), s
    assert summary["skipped_samples"] == len(skipped) and summary["frames_dropped"] == {}
    assert summary["samples"] == summary["rows"] == EPOCHS * (manifest.num_samples - len(victims))


def test_keep_trains_on_the_garbled_ones_as_before(corrupt, tmp_path):
    manifest, victims = corrupt
    summary = _run(manifest.uri, tmp_path / "summary.json", "--corrupt-jpegs", "keep")
    # the crop decoder still refuses a file that ends before the rows a crop needs, as it always did
    assert {victims[s["key"]] for s in summary["skipped"]} <= {"truncated", "without EOI"}
    assert summary["samples"] == EPOCHS * manifest.num_samples - len(summary["skipped"])
    assert summary["per_epoch_unique"] == [manifest.num_samples - sum(s["epoch"] == e for s in summary["skipped"])
                                           for e in range(EPOCHS)]


@pytest.mark.parametrize("corrupt", ["skip", "keep"])
def test_the_host_decoder_standing_in_for_dali_follows_the_jobs_corrupt_jpegs(corrupt):
    """A garbled JPEG shipped (it had a restart index, or the job keeps corrupt ones) that DALI refuses:
    the consumer's host decoder refuses it too, in libjpeg's words, unless the job keeps them."""
    transform = TrainTransform(size=32)
    work = ShipEncoded(transform)
    images = [encode(320, 240, seed=7), garbled(encode(320, 240, seed=8)), encode(240, 320, seed=9)]
    tensors = work.tensors([work.prepare(Sample(i, f"img{i}", 0, data), sample_random(1, 0, i)).payload
                            for i, data in enumerate(images)])
    ends = tensors["jpeg_end"]
    jpegs = [tensors["jpeg"][s:e] for s, e in zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)]
    decoder = RefusesTheFirst(jpegs[1], 32, 8, "cpu", 1, corrupt)
    outputs, failed = decoder.decode(jpegs, tensors["crop"], tensors["flip"])
    if corrupt == "skip":
        assert list(failed) == [1] and "the host decoder too: corrupt JPEG data: libjpeg warned" in failed[1]
    else:
        assert failed == {} and decoder.fallbacks == 1 and outputs[1].shape == (1, 32, 32, 3)
