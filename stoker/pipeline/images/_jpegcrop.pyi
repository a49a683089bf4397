# The C extension's interface (stoker/pipeline/images/_jpegcrop.c), for type checkers: a compiled module
# has no source to read.
"""Crop-window JPEG decoding with libjpeg-turbo."""

from typing import Literal

import numpy as np
from numpy.typing import NDArray
from typing_extensions import Buffer

LIBJPEG_TURBO_VERSION_NUMBER: int

def header(data: Buffer, /) -> tuple[int, int, int, str, bool]:
    """(width, height, components, colorspace, progressive) from the JPEG header alone."""

def decode(data: Buffer, denom: int, left: int, top: int, right: int, bottom: int, num: int = 1,
           restarts: Buffer | None = None, *, strict: bool = False,
           channels: Literal[3, 4] = 4) -> tuple[bytes, int, int, int, int,
                                                 Literal["plain", "spliced", "whole", "rejected"]]:
    """(RGBX bytes, or RGB with channels 3, width, height, x, y, path) of the window scaled num/denom;
    ValueError when undecodable, and strict, when libjpeg says the file is corrupt or truncated."""

def scan(data: Buffer, /) -> str | None:
    """None, or why libjpeg says the file is corrupt or truncated (an entropy-only pass at 1/8 scale);
    ValueError when it is not decodable at all."""

def pack_rgb(rgbx: Buffer, target: Buffer | NDArray[np.uint8], width: int, height: int, flip: bool, /) -> None:
    """Write `rgbx` (width x height 4-byte pixels) into the contiguous `target` as RGB, mirrored left to
    right with `flip`; ValueError when either size does not fit."""
