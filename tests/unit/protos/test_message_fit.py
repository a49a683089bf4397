"""protos/message_fit.py: a job whose batches cannot travel in one data message is refused, with the
largest image size that fits, computed from the frame limits as protos.framing cuts a batch."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.text.examples import TextConfig
from protos import message_fit
from protos import stoker_pb2 as pb
from protos.framing import MAX_FRAME_BYTES, MAX_FRAMES, encode_tensors
from protos.job import JobConfig


@pytest.mark.parametrize("batch_size", [1, 32, 64, 256, 1024])
def test_the_largest_image_size_fits_and_one_more_pixel_does_not(batch_size):
    largest = message_fit.largest_image_size(batch_size)
    assert message_fit.image_problem(batch_size, largest) is None
    assert message_fit.image_problem(batch_size, largest + 1) is not None


def test_the_bound_is_what_encode_tensors_makes_of_a_batch():
    """A batch of 2 at the largest size for 2 goes in at most MAX_FRAMES frames of at most the limit."""
    size = message_fit.largest_image_size(2)
    images = np.broadcast_to(np.zeros(1, np.uint8), (2, size, size, 3))
    frames = encode_tensors(pb.BatchHeader(), {"image": images, "label": np.zeros(2, np.int32)}, checksum=False)
    assert len(frames) <= MAX_FRAMES and all(memoryview(f).nbytes <= MAX_FRAME_BYTES for f in frames)
    assert (size + 1) ** 2 * 3 > MAX_FRAME_BYTES  # one pixel more and one image is over a frame


def test_too_many_frames_is_as_bad_as_one_image_too_big():
    """64 images of 2,400 px each take a frame of their own, 65 with the labels: one too many."""
    assert "65 frames, over the 64" in message_fit.image_problem(64, 2400)
    assert "over the 33488896-byte frame limit" in message_fit.image_problem(64, 3400)


def test_a_job_that_cannot_travel_is_refused_naming_both_flags_and_the_fix():
    with pytest.raises(ValueError, match="--image-size 3400 with --batch-size 64 does not fit a data message .*"
                                         "the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=3400)
    with pytest.raises(ValueError, match="--batch-size 1000000 does not fit"):
        JobConfig("m", dataset="wikipedia", batch_size=1_000_000, text=TextConfig())
    with pytest.raises(ValueError, match="the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=4000, decode_on="accelerator")  # the consumer would make the same batch itself
    JobConfig("m", image_size=2362)
