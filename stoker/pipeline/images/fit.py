"""The largest image size whose batches fit one data message, for a batch size.

protos.message_fit says whether any batch of tensors fits a message; this asks it of batches of
decoded images (pipeline.images.layout's host layout), so that a job with images too big for the
wire is refused before it starts, naming the largest size that fits.
"""

from __future__ import annotations

import math

from stoker.pipeline.images import layout as image_layout
from stoker.protos import message_fit
from stoker.protos.errors import ConfigError
from stoker.protos.framing import MAX_FRAME_BYTES


def image_problem(batch_size: int, image_size: int) -> str | None:
    """`message_fit.problem` for a batch of decoded images (the host-decoded layout)."""
    return message_fit.problem(batch_size, image_layout.tensor_specs(image_size))


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
    raise ConfigError(f"--image-size {image_size} with --batch-size {batch_size} does not fit a data message "
                     f"({why}); {fix}")
