# The C extension's interface (stoker/pipeline/images/_jpegrestart.c), for type checkers: a compiled module has no
# source to read.
"""Lossless restart-marker transcoding with libjpeg-turbo."""

from typing_extensions import Buffer

RESTART_INDEX_VERSION: int

def transcode(data: Buffer, interval_px: int, /) -> tuple[bytes, bytes | None, bool]:
    """(JPEG bytes, restart index or None, was progressive): the same pixels with restart markers."""
