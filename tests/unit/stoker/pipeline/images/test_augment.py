"""Decode + augment: crop sampling, determinism, draft decoding accuracy, odd JPEG modes, corrupt scans."""

import io

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.images import augment
from stoker.pipeline.images.augment import (
    DecodeError,
    EvalTransform,
    TrainTransform,
    corrupt_jpegs,
    decode_augment,
    decode_whole,
    refuse_corrupt,
)
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from stoker.protos.errors import ConfigError
from tests.awkward import cases, encode
from tests.corrupt_jpegs import garbled, truncated, without_eoi

needs_extension = pytest.mark.skipif(not augment.CROP_DECODER_AVAILABLE, reason="built without libjpeg-turbo headers")


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


FLAVOURS = [("RGB", {}), ("L", {}), ("CMYK", {}), ("RGB", {"progressive": True})]
BROKEN = {"garbled": (garbled, "corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: "),
          "truncated": (truncated, "truncated JPEG: libjpeg warned 'Premature end of JPEG file'"),
          "without EOI": (without_eoi, "truncated JPEG: libjpeg warned 'Premature end of JPEG file'")}


def _decode(data: bytes, decoder: str, index: int = 0) -> np.ndarray:
    """What a worker's transform gets from `data` by `decoder` ("whole": a transform that takes pixels)."""
    if decoder == "whole":
        return decode_whole(data)[0]
    return decode_augment(data, TrainTransform(), sample_random(0, 0, index), decoder).pixels


@needs_extension
@pytest.mark.parametrize("broken", list(BROKEN))
@pytest.mark.parametrize("mode,save", FLAVOURS, ids=["rgb", "grey", "cmyk", "progressive"])
@pytest.mark.parametrize("decoder", ["auto", "pillow", "full", "whole"])
def test_every_decode_path_refuses_a_broken_scan_in_libjpegs_words(decoder, mode, save, broken):
    """Today pillow-simd and the crop decoder below its window hand these over as grey or smeared pixels."""
    make, words = BROKEN[broken]
    data = make(_jpeg(mode, **save))
    for index in range(8):  # crops all over the image: the garble is below some, above others
        with pytest.raises(DecodeError) as refused:
            _decode(data, decoder, index)
        assert str(refused.value).startswith(words) or (broken == "garbled" and "decodable" in str(refused.value))


@needs_extension
@pytest.mark.parametrize("mode,save", FLAVOURS, ids=["rgb", "grey", "cmyk", "progressive"])
@pytest.mark.parametrize("decoder", ["auto", "pillow", "full", "whole"])
def test_keep_decodes_a_garbled_scan_as_before(decoder, mode, save):
    data = garbled(_jpeg(mode, **save))
    with corrupt_jpegs("keep"):
        pixels = _decode(data, decoder)
    assert pixels.dtype == np.uint8 and pixels.shape[-1] == 3
    with pytest.raises(DecodeError, match="libjpeg warned"):
        _decode(data, decoder)  # the policy holds inside the block only


@needs_extension
@pytest.mark.parametrize("decoder", ["auto", "pillow", "full", "whole"])
def test_awkward_but_valid_jpegs_are_not_taken_for_corrupt(decoder):
    for index, case in enumerate(cases()):
        data = encode(seed=index, **case)
        refuse_corrupt(data)
        assert _decode(data, decoder, index).shape[-1] == 3, case


def test_a_transform_that_takes_pixels_gets_pillow_simds_pixels():
    """decode_whole decodes a JPEG with the C extension where it can: the same libjpeg calls, the same pixels."""
    for mode, save in FLAVOURS:
        data = _jpeg(mode, size=(333, 250), **save)
        pixels, _ = decode_whole(data)
        assert np.array_equal(pixels, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))), mode
    png = io.BytesIO()
    Image.new("RGB", (30, 20), (1, 2, 3)).save(png, "PNG")
    assert decode_whole(png.getvalue())[0].shape == (20, 30, 3)  # any format pillow-simd reads


def test_a_policy_that_cannot_work_is_refused():
    with pytest.raises(ConfigError, match="skip, keep"):
        with corrupt_jpegs("ignore"):
            pass
