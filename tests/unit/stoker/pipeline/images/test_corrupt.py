"""stoker/pipeline/images/corrupt.py: the job's --corrupt-jpegs around the batching code's sample work, on every path a
worker decodes by (or ships by), with real JPEGs broken in the scan (tests.corrupt_jpegs)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from stoker.pipeline.images import augment
from stoker.pipeline.images.augment import TrainTransform
from stoker.pipeline.images.batching import HostTransform, ShipEncoded, unit_batches
from stoker.pipeline.images.corrupt import CorruptJpegs, job_sample_work
from stoker.pipeline.job import JobConfig
from stoker.pipeline.transforms import Output, Sample
from stoker.pipeline.units import Segment, Unit

pytestmark = pytest.mark.skipif(not augment.CROP_DECODER_AVAILABLE, reason="built without libjpeg-turbo headers")

WORDS = {"garbled": "corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: ",
         "truncated": "truncated JPEG: libjpeg warned 'Premature end of JPEG file'",
         "without EOI": "truncated JPEG: libjpeg warned 'Premature end of JPEG file'"}


@dataclass(frozen=True)
class MeanColour:
    """A transform of one's own that takes the whole image's pixels (pipeline.images.augment.decode_whole)."""

    takes: ClassVar[str] = "pixels"
    outputs: ClassVar[dict[str, Output]] = {"mean": Output("float32", (3,))}

    def __call__(self, sample: Sample, rng: random.Random, pixels: np.ndarray | None) -> dict[str, np.ndarray]:
        assert pixels is not None
        return {"mean": pixels.reshape(-1, 3).mean(axis=0).astype(np.float32)}


def _run(manifest, work) -> tuple[list[int], dict[str, str]]:
    """Every batch of the samples through `work`, as a worker makes them: (sample ids, key -> skip reason)."""
    unit = Unit(0, 0, (Segment(0, 0, manifest.num_samples, 0),))
    reader = manifest.open_shard(0)
    batches = list(unit_batches(lambda _: reader, unit, work, 16, seed=0))
    return [i for b in batches for i in b.sample_ids], {key: why for b in batches for _, key, why in b.skipped}


def _job(manifest, **fields) -> JobConfig:
    return JobConfig(manifest_uri=manifest.uri, image_size=64, **fields)


@pytest.mark.parametrize("decoder,takes,decode_on", [
    ("auto", "crop", "host"), ("crop", "crop", "host"), ("pillow", "crop", "host"), ("full", "crop", "host"),
    ("auto", "pixels", "host"), ("auto", "crop", "accelerator")])
def test_every_worker_path_skips_a_broken_scan_with_libjpegs_words(broken_scans, decoder, takes, decode_on):
    """Today each of these hands the garbled files over as grey or smeared pixels (and the crop decoder
    the truncated ones whose crop stops above the cut); DALI is given them to decode."""
    manifest, broken = broken_scans
    transform = MeanColour() if takes == "pixels" else TrainTransform(size=64)
    work = job_sample_work(transform, _job(manifest, decoder=decoder, decode_on=decode_on))
    delivered, skipped = _run(manifest, work)
    assert set(skipped) == set(broken) and len(delivered) == manifest.num_samples - len(broken)
    for key, how in broken.items():
        assert skipped[key].startswith(WORDS[how]), (key, skipped[key])


@pytest.mark.parametrize("decoder", ["auto", "pillow"])
def test_keep_delivers_the_garbled_ones_as_stoker_did_before(broken_scans, decoder):
    manifest, broken = broken_scans
    work = job_sample_work(TrainTransform(size=64), _job(manifest, decoder=decoder, corrupt_jpegs="keep"))
    assert isinstance(work, CorruptJpegs) and work.policy == "keep"
    _, skipped = _run(manifest, work)
    assert not {key for key, how in broken.items() if how == "garbled"} & set(skipped)
    assert all(broken[key] in ("truncated", "without EOI") for key in skipped)  # cut short: refused as before


def test_the_default_costs_nothing_and_only_shipping_bytes_is_checked_here(broken_scans):
    """Skip, decoded here: the batching code's own work, unwrapped (the decoders refuse by default).
    Keep on the accelerator: shipped as before."""
    manifest, _ = broken_scans
    transform = TrainTransform(size=64)
    assert type(job_sample_work(transform, _job(manifest))) is HostTransform
    assert type(job_sample_work(transform, _job(manifest, decode_on="accelerator", corrupt_jpegs="keep"))) \
        is ShipEncoded
    shipping = job_sample_work(transform, _job(manifest, decode_on="accelerator"))
    assert isinstance(shipping, CorruptJpegs) and shipping.refuse and not hasattr(shipping, "batch_rows")
    keeping = job_sample_work(transform, _job(manifest, corrupt_jpegs="keep"))
    assert keeping.limit is keeping.work.limit and keeping.batch_rows(2).arrays["image"].shape == (2, 64, 64, 3)


def test_the_scan_lies_between_the_sos_header_and_the_end_marker():
    import io

    from PIL import Image

    from stoker.pipeline.images.corrupt import scan_bounds
    from stoker.protos.errors import DataError

    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 60)).save(out, "JPEG", quality=90)
    jpeg = out.getvalue()
    start, end = scan_bounds(jpeg)
    assert jpeg[end:] == b"\xff\xd9" and 0 < start < end and b"\xff\xda" in jpeg[:start]
    with pytest.raises(DataError, match="no SOS marker"):
        scan_bounds(jpeg[:2] + b"\x00" * 10)
