"""The crop-window decoder (pipeline.images._jpegcrop) against the pillow-simd path, its fallback, and what it makes of
a corrupt scan."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.images import augment
from stoker.pipeline.images.augment import DecodeError, EvalTransform, TrainTransform, decode_augment
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from tests.corrupt_jpegs import garbled, truncated, without_eoi

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
        "import sys; sys.modules['stoker.pipeline.images._jpegcrop'] = None\n"
        "from stoker.pipeline.images import augment\n"
        "from stoker.pipeline.seeds import sample_random\n"
        "from stoker.pipeline.store.shards import Manifest, ShardReader\n"
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
    from stoker.pipeline.images import _jpegcrop

    data = bytes(ShardReader(manifest.shard_uri(0)).jpeg(0))
    width, height = _jpegcrop.header(data)[:2]
    for num in (3, 5, 6, 7):
        scaled_w, scaled_h = -(-width * num // 8), -(-height * num // 8)
        _, region_w, region_h, x, y, _ = _jpegcrop.decode(data, 8, 0, 0, scaled_w, scaled_h, num)
        assert (x, y, region_w, region_h) == (0, 0, scaled_w, scaled_h), num
    for denom, num in ((4, 3), (8, 0), (8, 17), (3, 1)):
        with pytest.raises(ValueError, match="scale must be"):
            _jpegcrop.decode(data, denom, 0, 0, 8, 8, num)


def _rgb(out: tuple) -> np.ndarray:
    pixels, width, height = out[:3]
    return np.frombuffer(pixels, np.uint8).reshape(height, width, -1)[..., :3]


def test_strict_refuses_a_garble_below_the_window_that_lenient_never_reads(manifest):
    """A garbled scan is mostly noticed at its end: strict, the decoder entropy-decodes on past the window."""
    from stoker.pipeline.images import _jpegcrop

    original = _jpeg_from_pillow(manifest)
    data = garbled(original)
    width, height = _jpegcrop.header(data)[:2]
    window = (2, 0, 0, width // 2, height // 16)  # the top rows, far above the garble
    lenient = _jpegcrop.decode(data, *window)
    assert np.array_equal(_rgb(lenient), _rgb(_jpegcrop.decode(original, *window)))  # nothing wrong up there
    with pytest.raises(ValueError, match="^corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: "):
        _jpegcrop.decode(data, *window, strict=True)
    assert np.array_equal(_rgb(_jpegcrop.decode(original, *window, strict=True)), _rgb(lenient))
    with pytest.raises(ValueError, match="^truncated JPEG: libjpeg warned 'Premature end of JPEG file'"):
        _jpegcrop.decode(without_eoi(original), *window, strict=True)


def test_strict_trusts_a_restart_index_and_reads_the_whole_scan_when_it_does_not_fit(manifest):
    """Only `stoker prepare`'s transcoder writes an index, and only for a file libjpeg decoded without a
    warning: a window spliced through it is not read past its band. An index that does not fit the file
    (rejected) leaves the file unchecked, so the whole scan is read."""
    from stoker.pipeline.images import _jpegcrop, _jpegrestart

    jpeg, index, _ = _jpegrestart.transcode(_jpeg_from_pillow(manifest), 32)
    width, height = _jpegcrop.header(jpeg)[:2]
    window = (2, width // 8, 0, width // 4, height // 16)
    assert _jpegcrop.decode(jpeg, *window, 1, index, strict=True)[5] == "spliced"
    broken = garbled(_jpeg_from_pillow(manifest))
    other_index = _jpegrestart.transcode(bytes(ShardReader(manifest.shard_uri(0)).jpeg(3)), 32)[1]
    for restarts in (None, other_index):
        with pytest.raises(ValueError, match="libjpeg warned"):
            _jpegcrop.decode(broken, *window, 1, restarts, strict=True)


def test_scan_hears_what_libjpeg_says_of_every_flavour(manifest):
    from stoker.pipeline.images import _jpegcrop

    for key, data in _flavours(manifest)[:80] + _flavours(manifest)[-40:]:
        assert _jpegcrop.scan(data) is None, key
    original = _jpeg_from_pillow(manifest)
    assert _jpegcrop.scan(garbled(original)).startswith("corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: ")
    assert _jpegcrop.scan(truncated(original)) == "truncated JPEG: libjpeg warned 'Premature end of JPEG file'"
    with pytest.raises(ValueError, match="not a decodable JPEG"):
        _jpegcrop.scan(b"\xff\xd8 not really")


def test_three_channels_are_the_rgbx_pixels_without_their_fourth_byte(manifest):
    from stoker.pipeline.images import _jpegcrop

    data = bytes(ShardReader(manifest.shard_uri(0)).jpeg(2))
    width, height = _jpegcrop.header(data)[:2]
    rgbx = _jpegcrop.decode(data, 1, 0, 0, width, height)
    rgb = _jpegcrop.decode(data, 1, 0, 0, width, height, channels=3)
    assert len(rgb[0]) == width * height * 3 and np.array_equal(_rgb(rgb), _rgb(rgbx))
    with pytest.raises(ValueError, match="channels"):
        _jpegcrop.decode(data, 1, 0, 0, width, height, channels=2)


def _jpeg_from_pillow(manifest) -> bytes:
    """A real photograph of the test set saved by pillow-simd: baseline, no restart markers."""
    out = io.BytesIO()
    Image.open(io.BytesIO(bytes(ShardReader(manifest.shard_uri(0)).jpeg(0)))).convert("RGB").save(out, "JPEG",
                                                                                                    quality=90)
    return out.getvalue()


@pytest.mark.parametrize("width", [1, 2, 5, 6, 7, 9, 223, 224, 225])
@pytest.mark.parametrize("flip", [False, True])
def test_pack_rgb_writes_each_pixel_once_mirrored_when_asked_and_nothing_past_its_target(width: int,
                                                                                          flip: bool) -> None:
    """The SIMD steps store 16 bytes for 12: every width around their step, and a target row followed by
    guard bytes that must stay untouched."""
    from stoker.pipeline.images import _jpegcrop

    rgbx = np.random.default_rng(width).integers(0, 256, (3, width, 4), dtype=np.uint8)
    guarded = np.full(3 * width * 3 + 16, 77, dtype=np.uint8)
    target = guarded[:3 * width * 3]
    _jpegcrop.pack_rgb(rgbx, target, width, 3, flip)
    want = rgbx[:, ::-1, :3] if flip else rgbx[:, :, :3]
    assert (target.reshape(3, width, 3) == want).all()
    assert (guarded[3 * width * 3:] == 77).all()


def test_pack_rgb_refuses_sizes_that_do_not_fit() -> None:
    from stoker.pipeline.images import _jpegcrop

    with pytest.raises(ValueError, match="needs 48 source and 36 contiguous target bytes"):
        _jpegcrop.pack_rgb(bytes(48), np.empty(35, np.uint8), 4, 3, False)
    with pytest.raises(TypeError, match="read-write bytes-like"):  # a strided view is no contiguous buffer
        _jpegcrop.pack_rgb(bytes(48), np.empty((3, 8, 3), np.uint8)[:, ::2], 4, 3, False)
