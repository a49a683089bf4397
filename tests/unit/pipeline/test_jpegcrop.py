"""The crop-window decoder (pipeline._jpegcrop) against the pillow-simd path, and its fallback."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline import augment
from stoker.pipeline.augment import DecodeError, EvalTransform, TrainTransform, decode_augment
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.shards import ShardReader

pytestmark = pytest.mark.skipif(not augment.CROP_DECODER_AVAILABLE, reason="built without libjpeg-turbo headers")


def _flavours(manifest) -> list[tuple[str, bytes]]:
    """Every real image of the test set, plus re-encodings as greyscale, CMYK and progressive."""
    out = []
    for shard in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(shard))
        for row in range(len(reader)):
            out.append((reader.key(row), bytes(reader.jpeg(row))))
    for key, data in out[:60]:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        for mode, options in (("L", {}), ("CMYK", {}), ("RGB", {"progressive": True})):
            buf = io.BytesIO()
            image.convert(mode).save(buf, "JPEG", quality=90, **options)
            out.append((f"{key}-{mode}-{'progressive' if options else 'baseline'}", buf.getvalue()))
    return out


@pytest.mark.parametrize("transform", [TrainTransform(), EvalTransform()], ids=["train", "eval"])
def test_crop_window_decoding_agrees_with_pillow_simd(manifest, transform):
    flavours = _flavours(manifest)
    assert len(flavours) >= 300
    worst, means = 0, []
    for index, (key, data) in enumerate(flavours):
        crop = decode_augment(data, transform, sample_random(0, 0, index), decoder="crop").pixels
        pillow = decode_augment(data, transform, sample_random(0, 0, index), decoder="pillow").pixels
        assert crop.shape == pillow.shape == (224, 224, 3) and crop.dtype == np.uint8, key
        diff = np.abs(crop.astype(int) - pillow.astype(int))
        worst = max(worst, int(diff.max()))
        means.append(diff.mean())
    assert worst <= 2  # the same crop, the same IDCT; only rounding at the window's edge differs
    assert np.mean(means) < 0.01


def test_greyscale_comes_out_as_equal_channels(manifest):
    data = bytes(ShardReader(manifest.shard_uri(0)).jpeg(0))
    buf = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("L").save(buf, "JPEG")
    pixels = decode_augment(buf.getvalue(), TrainTransform(), sample_random(0, 0, 0), decoder="crop").pixels
    assert np.array_equal(pixels[..., 0], pixels[..., 1]) and np.array_equal(pixels[..., 1], pixels[..., 2])


def test_crop_decoder_reports_truncation_inside_the_window(manifest):
    data = bytes(ShardReader(manifest.shard_uri(0)).jpeg(1))
    with pytest.raises(DecodeError, match="truncated|decodable"):
        decode_augment(data[: len(data) // 20], EvalTransform(), None, decoder="crop")
    with pytest.raises(DecodeError, match="JPEG"):
        decode_augment(b"\xff\xd8 not really", EvalTransform(), None, decoder="crop")


def test_without_the_extension_every_decoder_falls_back_to_pillow(manifest):
    code = (
        "import sys; sys.modules['stoker.pipeline._jpegcrop'] = None\n"
        "from stoker.pipeline import augment\n"
        "from stoker.pipeline.seeds import sample_random\n"
        "from stoker.pipeline.shards import Manifest, ShardReader\n"
        "assert not augment.CROP_DECODER_AVAILABLE\n"
        f"data = ShardReader(Manifest.load({manifest.uri!r}).shard_uri(0)).jpeg(0)\n"
        "for decoder in ('auto', 'crop'):\n"
        "    out = augment.decode_augment(data, augment.TrainTransform(), sample_random(0, 0, 5), decoder)\n"
        "    ref = augment.decode_augment(data, augment.TrainTransform(), sample_random(0, 0, 5), 'pillow')\n"
        "    assert (out.pixels == ref.pixels).all()\n"
        "print('fallback ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "fallback ok" in result.stdout, result.stderr


def test_an_m_over_8_scale_gives_libjpegs_size_and_a_bad_scale_is_refused(manifest):
    """The M/8 scales benchmarks/dct_scale.py measures: output ceil(size * M / 8); others refused."""
    from stoker.pipeline import _jpegcrop

    data = bytes(ShardReader(manifest.shard_uri(0)).jpeg(0))
    width, height = _jpegcrop.header(data)[:2]
    for num in (3, 5, 6, 7):
        scaled_w, scaled_h = -(-width * num // 8), -(-height * num // 8)
        _, region_w, region_h, x, y, _ = _jpegcrop.decode(data, 8, 0, 0, scaled_w, scaled_h, num)
        assert (x, y, region_w, region_h) == (0, 0, scaled_w, scaled_h), num
    for denom, num in ((4, 3), (8, 0), (8, 17), (3, 1)):
        with pytest.raises(ValueError, match="scale must be"):
            _jpegcrop.decode(data, denom, 0, 0, 8, 8, num)
