"""The restart-marker transcoder (pipeline.images._jpegrestart) and the crop decoder's splice of the
intervals a window touches (pipeline.images._jpegcrop with a restart index)."""

from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline import prepare
from stoker.pipeline.images import augment
from stoker.pipeline.store.shards import RESTART_INDEX_VERSION
from stoker.pipeline.store.stats import image_files

pytestmark = pytest.mark.skipif(not (augment.CROP_DECODER_AVAILABLE and prepare.transcoder_available()),
                                reason="built without libjpeg-turbo headers")
INTERVAL_PX = 32


def _jpeg(image: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos(raw_images) -> list[bytes]:
    """Baseline files of the test set, plus 4:4:4, 4:2:2, greyscale, odd-sized and progressive re-encodings."""
    from stoker.pipeline.images import _jpegcrop

    files = [p.read_bytes() for p in image_files(raw_images)]
    plain = [d for d in files if not _jpegcrop.header(d)[4] and _jpegcrop.header(d)[3] in ("ycbcr", "gray")][:24]
    image = Image.open(io.BytesIO(plain[0])).convert("RGB")
    odd = image.crop((0, 0, 333, 211))
    return plain + [_jpeg(image, quality=90, subsampling=0), _jpeg(image, quality=90, subsampling=1),
                    _jpeg(image.convert("L"), quality=85), _jpeg(odd, quality=80),
                    _jpeg(odd, quality=80, subsampling=0), _jpeg(image, quality=90, progressive=True),
                    _jpeg(odd.convert("L"), quality=90, progressive=True)]


def _transcode(data: bytes) -> tuple[bytes, bytes]:
    from stoker.pipeline.images import _jpegrestart

    jpeg, restarts, _ = _jpegrestart.transcode(data, INTERVAL_PX)
    return jpeg, restarts


def _index(restarts: bytes) -> tuple[int, int, int, list[int]]:
    version, r, per_row, n = struct.unpack_from("<4I", restarts)
    assert version == RESTART_INDEX_VERSION
    return r, per_row, n, list(struct.unpack_from(f"<{n + 1}I", restarts, 16))


def _window(pixels: tuple, left: int, top: int, right: int, bottom: int) -> np.ndarray:
    data, width, height, x, y, _ = pixels
    return np.frombuffer(data, np.uint8).reshape(height, width, 4)[top - y: bottom - y, left - x: right - x]


def test_transcoding_keeps_every_pixel_and_the_app_segments(photos):

    exif = Image.Exif()
    exif[0x010F] = "Stoker test camera"  # Make
    tagged = _jpeg(Image.open(io.BytesIO(photos[0])), quality=90, exif=exif.tobytes(), icc_profile=b"\x00" * 700)
    for data in [*photos, tagged]:
        jpeg, restarts = _transcode(data)
        before, after = Image.open(io.BytesIO(data)), Image.open(io.BytesIO(jpeg))
        assert np.array_equal(np.asarray(before), np.asarray(after))  # the same coefficients, the same decode
        assert after.info.get("exif") == before.info.get("exif")
        assert after.info.get("icc_profile") == before.info.get("icc_profile")
    assert Image.open(io.BytesIO(_transcode(tagged)[0])).getexif()[0x010F] == "Stoker test camera"


def test_the_index_lists_every_interval_and_intervals_tile_each_row(photos):
    from stoker.pipeline.images import _jpegcrop

    for data in photos:
        jpeg, restarts = _transcode(data)
        r, per_row, n, offsets = _index(restarts)
        width, height, components = _jpegcrop.header(jpeg)[:3]
        mcu = 8 if components == 1 else 16 if Image.open(io.BytesIO(data)).layer[0][1] == 2 else 8
        mcus_per_row = -(-width // mcu)
        assert r * per_row == mcus_per_row  # a row is a whole number of intervals
        assert 0.5 * INTERVAL_PX <= r * mcu <= 2 * INTERVAL_PX or per_row == 1
        assert n % per_row == 0
        for i, start in enumerate(offsets[1:-1], start=1):
            assert jpeg[start - 2: start] == bytes([0xFF, 0xD0 + (i - 1) % 8])
        assert jpeg[offsets[-1]: offsets[-1] + 2] == b"\xff\xd9"


@pytest.mark.parametrize("scale", [(1, 1), (1, 2), (1, 4), (1, 8), (3, 8), (5, 8)], ids=str)
def test_restart_indexed_crops_decode_to_the_same_pixels_as_the_plain_file(photos, scale):
    from stoker.pipeline.images import _jpegcrop

    num, denom = scale
    rng = random.Random(denom * 10 + num)
    paths = []
    for data in photos:
        jpeg, restarts = _transcode(data)
        width, height = _jpegcrop.header(data)[:2]
        scaled_w, scaled_h = -(-width * num // denom), -(-height * num // denom)
        for _ in range(12):
            left, top = rng.randrange(scaled_w), rng.randrange(scaled_h)
            right, bottom = rng.randrange(left + 1, scaled_w + 1), rng.randrange(top + 1, scaled_h + 1)
            plain = _jpegcrop.decode(data, denom, left, top, right, bottom, num)
            spliced = _jpegcrop.decode(jpeg, denom, left, top, right, bottom, num, restarts)
            paths.append(spliced[5])
            assert np.array_equal(_window(plain, left, top, right, bottom), _window(spliced, left, top, right, bottom))
    assert paths.count("spliced") > 0.8 * len(paths)
    assert set(paths) <= {"spliced", "whole"}


def test_a_window_of_the_whole_image_decodes_the_whole_file(photos):
    from stoker.pipeline.images import _jpegcrop

    jpeg, restarts = _transcode(photos[0])
    width, height = _jpegcrop.header(jpeg)[:2]
    assert _jpegcrop.decode(jpeg, 1, 0, 0, width, height, 1, restarts)[5] == "whole"
    assert _jpegcrop.decode(jpeg, 1, 0, 0, width, height)[5] == "plain"


def test_a_wrong_or_damaged_index_is_rejected_and_the_file_decoded_without_it(photos):
    from stoker.pipeline.images import _jpegcrop

    (first, index_of_first), (second, index_of_second) = (_transcode(d) for d in photos[:2])
    window = (2, 40, 30, 120, 90)
    plain = _jpegcrop.decode(second, *window)
    for index in (index_of_first, index_of_second[:-4], b"\x00" * 40, struct.pack("<4I", 9, 1, 1, 1) + b"\0" * 8):
        out = _jpegcrop.decode(second, *window, 1, index)
        assert out[5] == "rejected"
        assert np.array_equal(_window(out, *window[1:]), _window(plain, *window[1:]))
    rng = random.Random(7)
    for _ in range(300):  # any corruption of the index: a clean error or some pixels, never a crash
        damaged = bytearray(index_of_second)
        damaged[rng.randrange(16, len(damaged))] = rng.randrange(256)
        try:
            _jpegcrop.decode(second, *window, 1, bytes(damaged))
        except ValueError:
            pass


def test_a_truncated_transcoded_file_is_a_clean_error(photos):
    from stoker.pipeline.images import _jpegcrop

    jpeg, restarts = _transcode(photos[0])
    width, height = _jpegcrop.header(jpeg)[:2]
    with pytest.raises(ValueError, match="truncated|decodable"):
        _jpegcrop.decode(jpeg[: len(jpeg) // 3], 1, width // 4, height // 2, width // 2, height - 1, 1, restarts)


def test_a_progressive_file_is_written_sequential_with_the_same_pixels(photos):
    from stoker.pipeline.images import _jpegcrop, _jpegrestart

    image = Image.open(io.BytesIO(photos[0])).convert("RGB")
    progressive = _jpeg(image, quality=88, progressive=True)
    jpeg, restarts, was_progressive = _jpegrestart.transcode(progressive, INTERVAL_PX)
    assert was_progressive and not _jpegrestart.transcode(photos[0], INTERVAL_PX)[2]
    assert _jpegcrop.header(progressive)[4] and not _jpegcrop.header(jpeg)[4]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(jpeg))), np.asarray(Image.open(io.BytesIO(progressive))))


def test_the_transcoder_refuses_what_the_splice_cannot_take(photos):
    from stoker.pipeline.images import _jpegrestart

    image = Image.open(io.BytesIO(photos[0])).convert("RGB")
    junk = photos[0].index(b"\xff\xdb")  # libjpeg warns "extraneous bytes before marker": kept as it was
    with pytest.raises(ValueError, match="extraneous"):
        _jpegrestart.transcode(photos[0][:junk] + b"\x00\x01" + photos[0][junk:], INTERVAL_PX)
    with pytest.raises(NotImplementedError, match="CMYK"):
        _jpegrestart.transcode(_jpeg(image.convert("CMYK")), INTERVAL_PX)
    with pytest.raises(ValueError, match="truncated|corrupt|decodable"):
        _jpegrestart.transcode(photos[0][: len(photos[0]) // 2], INTERVAL_PX)
    with pytest.raises(ValueError, match="decodable"):
        _jpegrestart.transcode(b"\xff\xd8 not a jpeg", INTERVAL_PX)
    with pytest.raises(ValueError, match="interval_px"):
        _jpegrestart.transcode(photos[0], 4)


def test_without_markers_only_the_huffman_tables_change(photos):
    from stoker.pipeline.images import _jpegrestart

    jpeg, restarts, _ = _jpegrestart.transcode(photos[0], 0)
    assert restarts is None and b"\xff\xdd" not in jpeg[: jpeg.index(b"\xff\xda")]  # no DRI segment
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(jpeg))), np.asarray(Image.open(io.BytesIO(photos[0]))))


def test_the_index_version_is_the_same_in_c_and_python():
    from stoker.pipeline.images import _jpegrestart

    assert _jpegrestart.RESTART_INDEX_VERSION == RESTART_INDEX_VERSION
