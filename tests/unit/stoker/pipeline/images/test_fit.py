"""stoker/pipeline/images/fit.py: the largest image size whose batches fit a data message, computed from the
frame limits as protos.framing cuts a batch of decoded images."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.pipeline.images import fit as image_fit
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import MAX_FRAME_BYTES, MAX_FRAMES, encode_tensors


@pytest.mark.parametrize("batch_size", [1, 32, 64, 256, 1024])
def test_the_largest_image_size_fits_and_one_more_pixel_does_not(batch_size):
    largest = image_fit.largest_image_size(batch_size)
    assert image_fit.image_problem(batch_size, largest) is None
    assert image_fit.image_problem(batch_size, largest + 1) is not None


def test_the_bound_is_what_encode_tensors_makes_of_a_batch():
    """A batch of 2 at the largest size for 2 goes in at most MAX_FRAMES frames of at most the limit."""
    size = image_fit.largest_image_size(2)
    images = np.broadcast_to(np.zeros(1, np.uint8), (2, size, size, 3))
    frames = encode_tensors(pb.BatchHeader(), {"image": images, "label": np.zeros(2, np.int32)}, checksum=False)
    assert len(frames) <= MAX_FRAMES and all(memoryview(f).nbytes <= MAX_FRAME_BYTES for f in frames)
    assert (size + 1) ** 2 * 3 > MAX_FRAME_BYTES  # one pixel more and one image is over a frame


def test_too_many_frames_is_as_bad_as_one_image_too_big():
    """64 images of 2,400 px each take a frame of their own, 65 with the labels: one too many."""
    assert "65 frames, over the 64" in image_fit.image_problem(64, 2400)
    assert "over the 33488896-byte frame limit" in image_fit.image_problem(64, 3400)


def test_images_that_cannot_travel_are_refused_with_the_largest_size_that_fits():
    with pytest.raises(ValueError, match="--image-size 3400 with --batch-size 64 does not fit a data message .*"
                                         "the largest --image-size that fits --batch-size 64 is 2362"):
        image_fit.check_images(64, 3400)
    image_fit.check_images(64, 2362)
