# The C extension's interface (pipeline/_jpegcrop.c), for type checkers: a compiled module has no source to read.
"""Crop-window JPEG decoding with libjpeg-turbo."""

from typing import Literal

from typing_extensions import Buffer

LIBJPEG_TURBO_VERSION_NUMBER: int

def header(data: Buffer, /) -> tuple[int, int, int, str, bool]:
    """(width, height, components, colorspace, progressive) from the JPEG header alone."""

def decode(data: Buffer, denom: int, left: int, top: int, right: int, bottom: int, num: int = 1,
           restarts: Buffer | None = None, /) -> tuple[bytes, int, int, int, int,
                                                       Literal["plain", "spliced", "whole", "rejected"]]:
    """(RGBX bytes, width, height, x, y, path) of the window scaled num/denom; ValueError when undecodable."""
