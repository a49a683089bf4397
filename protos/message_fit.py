"""Whether a job's batch fits one data message, and the largest image size that does for a batch size.

A data message is a header of at most MAX_HEADER_BYTES and at most MAX_FRAMES tensor frames of at
most MAX_FRAME_BYTES each (protos.framing cuts a tensor into frames along its rows, so one row
must fit a frame). A batch beyond that cannot travel: the consumer's socket cuts the connection
under a frame over its size cap (ZeroMQ's MAXMSGSIZE, before Stoker sees a byte), or drops a batch
of too many frames, and its unit is made and lost again and again. So such a job is refused before
it starts, with the largest size that fits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from pipeline import image_layout
from pipeline.tensors import TensorSpec
from protos.framing import MAX_FRAME_BYTES, MAX_FRAMES, MAX_HEADER_BYTES, rows_per_frame

HEADER_BYTES_PER_ROW = 10  # a sample id: a varint of at most 10 bytes
HEADER_BYTES_PER_FRAME = 64  # a frame's description: tensor name, dtype, shape, byte count
HEADER_FIXED_BYTES = 4096  # ids, lease token, stage times, text statistics


def row_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def problem(rows: int, tensors: Mapping[str, TensorSpec], ragged: Mapping[str, str] | None = None) -> str | None:
    """Why a batch of `rows` rows of these tensors cannot travel in one data message; None if it can.
    A ragged tensor (JPEG bytes) is counted as one frame: its size depends on the files."""
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


def image_problem(batch_size: int, image_size: int) -> str | None:
    """`problem` for a batch of decoded images (the host-decoded layout, pipeline.image_layout)."""
    return problem(batch_size, image_layout.tensor_specs(image_size))


def largest_image_size(batch_size: int) -> int:
    """The largest --image-size whose batches of `batch_size` fit a message (0: none does)."""
    low, high = 0, math.isqrt(MAX_FRAME_BYTES // 3)  # one row of (size, size, 3) bytes must fit a frame
    while low < high:
        middle = (low + high + 1) // 2
        if image_problem(batch_size, middle) is None:
            low = middle
        else:
            high = middle - 1
    return low


def check_images(batch_size: int, image_size: int) -> None:
    """Refuse, naming both flags and the largest size that fits, images that cannot travel."""
    why = image_problem(batch_size, image_size)
    if why is None:
        return
    largest = largest_image_size(batch_size)
    fix = (f"the largest --image-size that fits --batch-size {batch_size} is {largest}" if largest
           else f"no --image-size fits --batch-size {batch_size}: lower it")
    raise ValueError(f"--image-size {image_size} with --batch-size {batch_size} does not fit a data message "
                     f"({why}); {fix}")
