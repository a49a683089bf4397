"""JPEGs whose header is valid and whose scan is not, as real collections hold them: bytes overwritten
in the middle of the entropy-coded data (a disk or transfer error), or the file cut short.

pillow-simd decodes the garbled ones without a word (grey or smeared rows where the scan lost its
way); libjpeg warns. A garble that happens to leave the Huffman decoder in step again and the
scan ending where it should cannot be told from the bytes (about 1 in 10 of 16 random bytes on the
default set's files): `garbled` takes the first seed whose garble libjpeg warns about, so every
file made here is one libjpeg says is corrupt.
"""

from __future__ import annotations

import random

from stoker.pipeline.images.corrupt import scan_bounds


def _garble(jpeg: bytes, seed: int, length: int) -> bytes:
    start, end = scan_bounds(jpeg)
    middle = (start + end) // 2
    rng = random.Random(seed)
    noise = bytes(rng.randrange(0xFF) for _ in range(length))  # no 0xFF: no marker appears, the frame stays whole
    return jpeg[:middle] + noise + jpeg[middle + length:]


def libjpeg_warns(jpeg: bytes) -> bool:
    """The transcoder (pipeline.images._jpegrestart, older than the checks under test) refuses it as corrupt;
    a CMYK file, which it does not take, by the crop decoder's own pass (imported here: a host
    built without them still collects the tests)."""
    from stoker.pipeline.images import _jpegcrop, _jpegrestart

    try:
        _jpegrestart.transcode(jpeg, 0)
    except ValueError as exc:
        return "corrupt or truncated" in str(exc)
    except NotImplementedError:
        try:
            return _jpegcrop.scan(jpeg) is not None
        except ValueError:
            return False  # not decodable at all: another kind of test
    return False


def garbled(jpeg: bytes, length: int = 16) -> bytes:
    """`length` bytes in the middle of the scan overwritten with noise that libjpeg notices; the
    header and the file's length unchanged."""
    for seed in range(50):
        out = _garble(jpeg, seed, length)
        if libjpeg_warns(out):
            return out
    raise AssertionError("no garble of this file is noticed")


def truncated(jpeg: bytes, keep: float = 0.6) -> bytes:
    """The file cut inside its scan, `keep` of the way through."""
    start, end = scan_bounds(jpeg)
    return jpeg[: start + int((end - start) * keep)]


def without_eoi(jpeg: bytes) -> bytes:
    """Every byte of the scan, but not the EOI marker: the pixels are whole, libjpeg says the file ended early."""
    return jpeg[: jpeg.rindex(b"\xff\xd9")]
