"""Decode + augment: crop sampling, determinism, draft decoding accuracy, odd JPEG modes."""

import io

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.augment import DecodeError, EvalTransform, TrainTransform, decode_augment
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.shards import ShardReader


def _jpeg(mode="RGB", size=(500, 375), **save):
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    image = Image.fromarray(base).resize(size, Image.Resampling.BICUBIC).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def test_train_crops_respect_area_and_ratio_ranges():
    t = TrainTransform()
    for i in range(500):
        crop = t.crop(500, 375, sample_random(0, 0, i))
        assert 0 <= crop.left and crop.left + crop.width <= 500
        assert 0 <= crop.top and crop.top + crop.height <= 375
        area = crop.width * crop.height / (500 * 375)
        assert 0.04 <= area <= 1.0


def test_eval_crop_is_the_centre_of_the_resized_image():
    crop = EvalTransform().crop(512, 256)
    assert crop.width == crop.height == pytest.approx(224)
    assert crop.left == pytest.approx(144) and crop.top == pytest.approx(16)


def test_same_seed_epoch_key_gives_identical_pixels():
    data = _jpeg()
    a = decode_augment(data, TrainTransform(), sample_random(7, 3, 42)).pixels
    b = decode_augment(data, TrainTransform(), sample_random(7, 3, 42)).pixels
    c = decode_augment(data, TrainTransform(), sample_random(7, 4, 42)).pixels
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("mode,save", [("RGB", {}), ("L", {}), ("CMYK", {}), ("RGB", {"progressive": True})])
def test_every_jpeg_flavour_becomes_rgb_224(mode, save):
    out = decode_augment(_jpeg(mode, **save), TrainTransform(), sample_random(0, 0, 1)).pixels
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8


def test_draft_decoding_matches_full_decoding(manifest):
    """DCT-scaled decoding of the crop window stays close to decoding every pixel."""
    reader = ShardReader(manifest.shard_uri(0))
    diffs = []
    for row in range(40):
        data = reader.jpeg(row)
        fast = decode_augment(data, TrainTransform(), sample_random(0, 0, row), decoder="pillow").pixels
        full = decode_augment(data, TrainTransform(), sample_random(0, 0, row), decoder="full").pixels
        diffs.append(np.abs(fast.astype(int) - full.astype(int)).mean())
    assert np.median(diffs) < 6.0, diffs
    assert max(diffs) < 16.0, diffs


def test_corrupt_and_foreign_bytes_raise_decode_error():
    with pytest.raises(DecodeError):
        decode_augment(_jpeg()[:2000], TrainTransform(), sample_random(0, 0, 0))
    png = io.BytesIO()
    Image.new("RGB", (300, 300)).save(png, "PNG")
    with pytest.raises(DecodeError, match="not a JPEG"):
        decode_augment(png.getvalue(), TrainTransform(), sample_random(0, 0, 0))
