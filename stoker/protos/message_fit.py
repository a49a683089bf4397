"""Whether a batch of tensors fits one data message (pipeline.images.fit asks it of images).

A data message is a header of at most MAX_HEADER_BYTES and at most MAX_FRAMES tensor frames of at
most MAX_FRAME_BYTES each (protos.framing cuts a tensor into frames along its rows, so one row
must fit a frame). A batch beyond that cannot travel: the consumer's socket cuts the connection
under a frame over its size cap (ZeroMQ's MAXMSGSIZE, before Stoker sees a byte), or drops a batch
of too many frames, and its unit is made and lost again and again. So such a job is refused before
it starts. The tensors are described by their dtype and per-row shape only: the wire knows no
images or text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from stoker.protos.framing import MAX_FRAME_BYTES, MAX_FRAMES, MAX_HEADER_BYTES, rows_per_frame

HEADER_BYTES_PER_ROW = 10  # a sample id: a varint of at most 10 bytes
HEADER_BYTES_PER_FRAME = 64  # a frame's description: tensor name, dtype, shape, byte count
HEADER_FIXED_BYTES = 4096  # ids, lease token, stage times, text statistics


class RowSpec(Protocol):
    """A tensor as a batch carries it: its numpy dtype string and the shape of one row."""

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


def row_bytes(spec: RowSpec) -> int:
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def problem(rows: int, tensors: Mapping[str, RowSpec], ragged: Mapping[str, str] | None = None) -> str | None:
    """Why a batch of `rows` rows of these tensors cannot travel in one data message; None if it can.
    A ragged tensor (rows of any length, one flat run) is counted as one frame: its size depends on
    the data."""
    frames = 0
    for name, spec in tensors.items():
        if ragged and name in ragged:
            frames += 1
            continue
        size = row_bytes(spec)
        if size > MAX_FRAME_BYTES:
            return f"one row of {name} is {size} bytes, over the {MAX_FRAME_BYTES}-byte frame limit"
        frames += math.ceil(rows / rows_per_frame(size))
    if frames > MAX_FRAMES:
        return f"a batch takes {frames} frames, over the {MAX_FRAMES} a message may carry"
    header = HEADER_FIXED_BYTES + rows * HEADER_BYTES_PER_ROW + frames * HEADER_BYTES_PER_FRAME
    if header > MAX_HEADER_BYTES:
        return f"a batch's header takes about {header} bytes, over the {MAX_HEADER_BYTES}-byte limit"
    return None

