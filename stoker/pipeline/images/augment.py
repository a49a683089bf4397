"""ResNet-50 v1.5 image transforms with DCT-scaled, crop-window JPEG decoding.

A transform first chooses a crop box in the coordinates of the stored JPEG, from the image
size alone (read from the header, no decode). The decoder then asks libjpeg for the largest
DCT reduction (1/2, 1/4, 1/8) that still leaves the crop at least as large as the output,
and resizes just that box. Two decoders do this:

- "crop" (pipeline.images._jpegcrop, a small C extension over libjpeg-turbo): decodes only the
  rows and iMCU columns of the crop window (plus a 2-pixel margin for the resize filter);
  given the restart index that `stoker prepare` stores beside a transcoded file, it also
  entropy-decodes only the restart intervals the window touches, to the same pixels;
- "pillow": pillow-simd's draft mode, which decodes the whole image at the reduced scale.

"auto" picks "crop" when the extension was built, else "pillow"; CMYK/YCCK files always
take the pillow path. "full" decodes at full resolution (the reference the others are
tested against). All give the same crop; pixels agree within a tested tolerance.

A JPEG that libjpeg says is corrupt (a garbled or truncated scan: "Corrupt JPEG data: ...",
"Premature end of JPEG file") raises DecodeError with libjpeg's words on every path, so a worker
skips and counts it rather than train on the grey or smeared pixels libjpeg makes of it (the
job's `--corrupt-jpegs keep` trains on them, as before: `corrupt_jpegs`). The crop decoder hears
libjpeg itself and, for a file without a restart index, entropy-decodes the rows below the window
too (a garbled scan is mostly noticed at its end); pillow-simd drops libjpeg's warnings, so the
pillow paths first `refuse_corrupt` (an entropy-only pass through the C extension), except for a
file with a restart index: `stoker prepare`'s transcoder writes one only for a file libjpeg
decoded without a warning.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np
import pyarrow as pa
from PIL import Image

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.transforms import Crop, Output
from stoker.protos.errors import ConfigError, DataError

if TYPE_CHECKING:
    from stoker.pipeline.transforms import Sample

try:
    from stoker.pipeline.images import _jpegcrop
except ImportError:  # built without libjpeg-turbo's headers: the pillow path does everything
    _jpegcrop = None  # type: ignore[assignment]  # mypy's idiom for an optional module: None = not built

DECODERS = ("auto", "crop", "pillow", "full")
# How a sample was decoded: the crop decoder on a file without an index, on the restart intervals
# the window touches, on the whole file (the window needs it all), on the whole file because its
# index did not match it; or pillow-simd.
DECODE_PATHS = ("plain", "spliced", "whole", "rejected", "pillow")
CROP_DECODER_AVAILABLE = _jpegcrop is not None
# What a worker does with a JPEG libjpeg says is corrupt: skip it and count it with libjpeg's words
# (default), or keep it and train on what libjpeg makes of it (Pillow's behaviour, and Stoker's before).
CORRUPT_JPEGS = ("skip", "keep")
_KEEP_CORRUPT: ContextVar[bool] = ContextVar("stoker_keep_corrupt_jpegs", default=False)
_FILTER_MARGIN = 2  # scaled pixels decoded around the box so the bilinear filter sees its neighbours

# MLPerf's reference (TF sample_distorted_bounding_box) and torchvision's defaults.
REFERENCE_AREA = (0.05, 1.0)
TORCHVISION_AREA = (0.08, 1.0)


class DecodeError(DataError):
    """The bytes are not a decodable JPEG."""


@contextmanager
def corrupt_jpegs(policy: str) -> Iterator[None]:
    """The decoders below treat corrupt JPEGs by `policy` (CORRUPT_JPEGS) inside this block, in this
    thread: a worker sets its job's choice around each sample (pipeline.images.corrupt), as the decode calls
    are the batching code's, which knows no job."""
    if policy not in CORRUPT_JPEGS:
        raise ConfigError(f"corrupt_jpegs must be one of {', '.join(CORRUPT_JPEGS)}, not {policy!r}")
    token = _KEEP_CORRUPT.set(policy == "keep")
    try:
        yield
    finally:
        _KEEP_CORRUPT.reset(token)


def refuse_corrupt(jpeg: bytes | memoryview) -> None:
    """DecodeError, with libjpeg's words, when libjpeg says `jpeg` is corrupt or truncated: for the
    decoders that do not pass its warnings on (pillow-simd's, DALI's). An entropy-only pass at 1/8
    scale (docs/measurements.md). Without the C extension it can only let the file through."""
    if _jpegcrop is None:
        return
    try:
        reason = _jpegcrop.scan(jpeg)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    if reason:
        raise DecodeError(reason)


def _strict() -> bool:
    """Whether a corrupt JPEG is refused here (corrupt_jpegs)."""
    return not _KEEP_CORRUPT.get()


class _CropOnly:
    """The built-in transforms are crop-first transforms of the contract (pipeline.transforms) whose
    output is the resized, mirrored crop itself."""

    takes: ClassVar[str] = "crop"
    crop_output: ClassVar[str] = "image"  # the output that is the crop as decoded (batching lends its row)
    size: int

    @property
    def crop_size(self) -> int:
        return self.size

    @property
    def outputs(self) -> dict[str, Output]:
        return {"image": Output("uint8", (self.size, self.size, 3))}

    def __call__(self, sample: Sample, rng: random.Random, pixels: np.ndarray | None) -> Mapping[str, np.ndarray]:
        return {"image": cast(np.ndarray, pixels)}  # a crop-first transform is always given the resized crop


@dataclass(frozen=True)
class TrainTransform(_CropOnly):
    """Random resized crop + random horizontal flip (MLPerf ResNet-50 v1.5 training)."""

    size: int = 224
    min_area: float = REFERENCE_AREA[0]
    max_area: float = REFERENCE_AREA[1]
    min_ratio: float = 3 / 4
    max_ratio: float = 4 / 3
    flip_probability: float = 0.5
    attempts: int = 10

    def crop(self, width: int, height: int, rng: random.Random) -> Crop:
        """torchvision's RandomResizedCrop sampling, with a centre-crop fallback."""
        area = width * height
        log_lo, log_hi = math.log(self.min_ratio), math.log(self.max_ratio)
        flip = rng.random() < self.flip_probability
        for _ in range(self.attempts):
            target = area * rng.uniform(self.min_area, self.max_area)
            ratio = math.exp(rng.uniform(log_lo, log_hi))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                left = rng.randint(0, width - w)
                top = rng.randint(0, height - h)
                return Crop(left, top, w, h, flip)
        in_ratio = width / height
        if in_ratio < self.min_ratio:
            w, h = width, round(width / self.min_ratio)
        elif in_ratio > self.max_ratio:
            h, w = height, round(height * self.max_ratio)
        else:
            w, h = width, height
        return Crop((width - w) // 2, (height - h) // 2, w, h, flip)


@dataclass(frozen=True)
class EvalTransform(_CropOnly):
    """Resize the shorter side to `resize`, then centre-crop `size` (MLPerf evaluation)."""

    size: int = 224
    resize: int = 256

    def crop(self, width: int, height: int, rng: random.Random | None = None) -> Crop:
        """The centre square that becomes `size` pixels after the shorter-side resize."""
        side = min(width, height) * self.size / self.resize
        return Crop((width - side) / 2, (height - side) / 2, side, side, False)


@dataclass(frozen=True)
class GivenCrop(_CropOnly):
    """A transform whose crop was drawn elsewhere: by the worker, when decoding moved to the
    accelerator and the consumer decodes one image on its CPU after DALI refused it."""

    box: Crop
    size: int = 224

    def crop(self, width: int, height: int, rng: random.Random | None = None) -> Crop:
        return self.box


Transform = TrainTransform | EvalTransform | GivenCrop  # or any crop-first transform (pipeline.transforms)


@dataclass
class DecodedSample:
    """One augmented image, the seconds spent decoding and augmenting it, and how it was decoded."""

    pixels: np.ndarray  # uint8, (size, size, 3)
    decode_s: float
    augment_s: float
    path: str = "pillow"  # DECODE_PATHS


def _draft_request(width: int, height: int, crop: Crop, size: int) -> tuple[int, int]:
    """The image size to ask libjpeg for so that the crop still covers `size` pixels."""
    return (
        max(1, math.ceil(width * size / max(crop.width, 1e-6))),
        max(1, math.ceil(height * size / max(crop.height, 1e-6))),
    )


def dct_denominator(width: int, height: int, request: tuple[int, int]) -> int:
    """libjpeg's scale 1/d for a draft request: the largest of 8, 4, 2, 1 that keeps it covered
    (the rule of Pillow's JpegImageFile.draft, so both decoders pick the same scale)."""
    scale = min(width // request[0], height // request[1])
    return next((d for d in (8, 4, 2) if scale >= d), 1)


def decode_augment(
    jpeg: bytes | memoryview,
    transform: Transform,
    rng: random.Random | None,
    decoder: str = "auto",
    restarts: bytes | memoryview | None = None,
    into: np.ndarray | None = None,
) -> DecodedSample:
    """Decode a JPEG (only as much and as finely as the crop needs) and apply the transform.
    `restarts`: the file's restart index (pipeline.store.shards), which only the crop decoder uses;
    `into`: a (size, size, 3) uint8 row the crop decoder writes the crop into (pillow's paths do not)."""
    if decoder not in DECODERS:
        raise ConfigError(f"decoder must be one of {', '.join(DECODERS)}, not {decoder!r}")
    strict = _strict()
    if decoder in ("auto", "crop") and _jpegcrop is not None:
        started = stage_clock()
        try:
            width, height, _, colorspace, _ = _jpegcrop.header(jpeg)
        except ValueError as exc:
            raise DecodeError(str(exc)) from exc
        if colorspace not in ("cmyk", "ycck"):
            return _decode_window(jpeg, transform, rng, width, height, started, restarts, strict, into)
    return _decode_pillow(jpeg, transform, rng, draft=decoder != "full", check=strict and restarts is None)


def jpeg_size(jpeg: bytes | memoryview) -> tuple[int, int]:
    """(width, height) from the JPEG header alone; DecodeError if there is no readable header."""
    if _jpegcrop is not None:
        try:
            return _jpegcrop.header(jpeg)[:2]
        except ValueError as exc:
            raise DecodeError(str(exc)) from exc
    try:
        image = Image.open(io.BytesIO(jpeg))  # lazy: reads the header only
    except Exception as exc:
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc
    if image.format != "JPEG":
        raise DecodeError(f"not a JPEG but {image.format}")
    return image.size


@dataclass(frozen=True)
class Window:
    """What the crop decoder decodes: scale 1/denom, rows [top, bottom) and columns [left, right)
    of the scaled image, and the crop box (floats) in those scaled coordinates."""

    denom: int
    left: int
    top: int
    right: int
    bottom: int
    box: tuple[float, float, float, float]


def crop_window(width: int, height: int, crop: Crop, size: int) -> Window:
    denom = dct_denominator(width, height, _draft_request(width, height, crop, size))
    scaled_w, scaled_h = -(-width // denom), -(-height // denom)
    sx, sy = scaled_w / width, scaled_h / height
    box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
    return Window(denom,
                  max(0, math.floor(box[0]) - _FILTER_MARGIN), max(0, math.floor(box[1]) - _FILTER_MARGIN),
                  min(scaled_w, math.ceil(box[2]) + _FILTER_MARGIN), min(scaled_h, math.ceil(box[3]) + _FILTER_MARGIN),
                  box)


def _choose(transform: Transform, width: int, height: int, rng: random.Random | None) -> Crop:
    """The transform's crop box. `rng` is None only from callers whose transform draws nothing
    (EvalTransform, GivenCrop: their `crop` takes None), which the types cannot tell apart."""
    return transform.crop(width, height, rng)  # type: ignore[arg-type]


def _decode_window(jpeg: bytes | memoryview, transform: Transform, rng: random.Random | None, width: int,
                   height: int, started: float, restarts: bytes | memoryview | None, strict: bool,
                   into: np.ndarray | None = None) -> DecodedSample:
    crop = _choose(transform, width, height, rng)
    w = crop_window(width, height, crop, transform.crop_size)
    box = w.box
    try:
        pixels, region_w, region_h, x, y, path = _jpegcrop.decode(jpeg, w.denom, w.left, w.top, w.right, w.bottom, 1,
                                                                  restarts, strict=strict)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    decoded = stage_clock()
    region = Image.frombuffer("RGBX", (region_w, region_h), pixels, "raw", "RGBX", 0, 1)  # no copy
    out = region.resize((transform.crop_size, transform.crop_size), Image.Resampling.BILINEAR,
                        box=(box[0] - x, box[1] - y, box[2] - x, box[3] - y))
    side = transform.crop_size
    array = into if into is not None else np.empty((side, side, 3), dtype=np.uint8)
    _jpegcrop.pack_rgb(_rgbx_of(out), array, side, side, crop.flip)
    return DecodedSample(array, decoded - started, stage_clock() - decoded, path)


def _rgbx_of(image: Image.Image) -> memoryview | bytes:
    """An RGBX image's pixels without a copy (Pillow's Arrow export: one buffer for an image in one
    memory block, as a crop's always is), else copied out."""
    try:
        return memoryview(pa.array(image).buffers()[-1])
    except ValueError:  # pixels spread over several blocks
        return image.tobytes("raw", "RGBX")


def _decode_pillow(
    jpeg: bytes | memoryview,
    transform: Transform,
    rng: random.Random | None,
    draft: bool,
    check: bool,
) -> DecodedSample:
    """pillow-simd: the whole image at the draft scale, then the box resized. `check`: refuse a
    corrupt file first (pillow-simd would decode it without a word)."""
    started = stage_clock()
    if check:
        refuse_corrupt(jpeg)
    try:
        image = Image.open(io.BytesIO(jpeg))
        if image.format != "JPEG":
            raise DecodeError(f"not a JPEG but {image.format}")
        width, height = image.size
        crop = _choose(transform, width, height, rng)
        if draft:
            image.draft("RGB", _draft_request(width, height, crop, transform.crop_size))
        image.load()
    except DecodeError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc
    decoded = stage_clock()
    sx, sy = image.size[0] / width, image.size[1] / height
    box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
    out = image.resize((transform.crop_size, transform.crop_size), Image.Resampling.BILINEAR, box=box)
    if out.mode != "RGB":
        out = out.convert("RGB")
    if crop.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)  # Pillow flips 4-byte pixels far faster than numpy
    return DecodedSample(np.asarray(out), decoded - started, stage_clock() - decoded)


def decode_whole(data: bytes | memoryview) -> tuple[np.ndarray, float]:
    """The whole image as RGB pixels (H, W, 3) uint8, and the seconds it took: what a transform
    that takes "pixels" gets. Any format pillow-simd reads; DecodeError when it reads none, or
    when it is a JPEG libjpeg says is corrupt (unless corrupt_jpegs("keep")). A JPEG is decoded
    by the C extension where it can (the same libjpeg calls as pillow-simd's, so the same pixels,
    and it hears libjpeg's warnings in the same pass)."""
    started = stage_clock()
    jpeg = bytes(data[:2]) == b"\xff\xd8"  # a shard's memoryview is of signed chars: compare bytes
    if jpeg and _jpegcrop is not None:
        pixels = _whole_jpeg(data)
        if pixels is not None:
            return pixels, stage_clock() - started
    if jpeg and _strict():
        refuse_corrupt(data)
    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        image.load()
        if image.mode != "RGB":
            image = image.convert("RGB")
        pixels = np.asarray(image)
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc
    return pixels, stage_clock() - started


def _whole_jpeg(data: bytes | memoryview) -> np.ndarray | None:
    """Every pixel of a JPEG by the crop decoder, as RGB; None for CMYK/YCCK (pillow-simd's)."""
    try:
        width, height, _, colorspace, _ = _jpegcrop.header(data)
        if colorspace in ("cmyk", "ycck"):
            return None
        pixels, region_w, region_h, *_ = _jpegcrop.decode(data, 1, 0, 0, width, height, strict=_strict(), channels=3)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    return np.frombuffer(pixels, dtype=np.uint8).reshape(region_h, region_w, 3)
