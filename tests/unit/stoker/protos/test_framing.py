"""The wire format: generated code in sync with the .proto, framing round trips and checks."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import MAX_FRAME_BYTES, FrameError, decode_tensors, encode_tensors, parse_data_message

PROTOS = Path(__file__).resolve().parents[4] / "stoker" / "protos"


def test_generated_code_matches_proto(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"--python_out={tmp_path}",
                    str(PROTOS / "stoker.proto")], check=True)
    assert (tmp_path / "stoker_pb2.py").read_text() == (PROTOS / "stoker_pb2.py").read_text(), \
        "stoker/protos/stoker_pb2.py is stale: run `make protos`"


def _batch(n=4, side=8):
    images = np.arange(n * side * side * 3, dtype=np.uint32).astype(np.uint8).reshape(n, side, side, 3)
    return images, np.arange(n, dtype=np.int32)


def test_round_trip_gives_views_of_the_frames():
    images, labels = _batch()
    header = pb.BatchHeader(sample_ids=range(4))
    frames = encode_tensors(header, {"image": images, "label": labels}, checksum=True)
    received = [bytes(memoryview(f)) for f in frames]
    tensors = decode_tensors(header, received)
    assert np.array_equal(tensors.array("image"), images)
    assert np.array_equal(tensors.array("label"), labels)
    view = tensors.parts["image"][0]
    assert not view.flags.owndata and view.base is not None  # a view of the frame, not a copy


def test_large_tensor_is_split_under_the_frame_limit():
    images, labels = _batch(n=10)
    header = pb.BatchHeader()
    frames = encode_tensors(header, {"image": images, "label": labels}, checksum=False,
                            max_frame_bytes=images[0].nbytes * 3)
    image_frames = [f for f, spec in zip(frames, header.frames, strict=True) if spec.tensor == "image"]
    assert len(image_frames) == 4
    assert all(memoryview(f).nbytes <= images[0].nbytes * 3 for f in image_frames)
    tensors = decode_tensors(header, [bytes(memoryview(f)) for f in frames])
    assert np.array_equal(tensors.array("image"), images)


def test_mismatched_sizes_and_checksums_are_rejected():
    images, labels = _batch()
    header = pb.BatchHeader()
    frames = [bytes(memoryview(f)) for f in encode_tensors(header, {"image": images, "label": labels}, True)]
    with pytest.raises(FrameError) as err:
        decode_tensors(header, [frames[0][:-1], frames[1]])
    assert err.value.reason == "size_mismatch"
    with pytest.raises(FrameError) as err:
        decode_tensors(header, frames[:1])
    assert err.value.reason == "frame_count"
    flipped = bytearray(frames[0])
    flipped[5] ^= 0xFF
    with pytest.raises(FrameError) as err:
        decode_tensors(header, [bytes(flipped), frames[1]])
    assert err.value.reason == "checksum"
    header.frames[0].dtype = "|O"
    with pytest.raises(FrameError) as err:
        decode_tensors(header, frames)
    assert err.value.reason == "bad_dtype"


def test_huge_declared_shape_is_rejected_without_allocating():
    header = pb.BatchHeader()
    header.frames.add(tensor="image", dtype="|u1", shape=[1 << 40, 1 << 20], nbytes=16)
    with pytest.raises(FrameError):
        decode_tensors(header, [b"x" * 16])


@pytest.mark.parametrize("shape", [[0, 1 << 40, 1 << 40, 1 << 40], [0, 1 << 62], [1] * 65],
                         ids=["empty-with-huge-dimensions", "empty-past-intp", "too-many-dimensions"])
def test_an_empty_frame_with_impossible_dimensions_is_a_size_mismatch(shape):
    header = pb.BatchHeader()
    header.frames.add(tensor="image", dtype="|u1", shape=shape, nbytes=0 if 0 in shape else 1)
    with pytest.raises(FrameError) as err:
        decode_tensors(header, [b"" if 0 in shape else b"x"])
    assert err.value.reason == "size_mismatch"


def test_an_empty_frame_of_sane_dimensions_is_taken():
    header = pb.BatchHeader()
    header.frames.add(tensor="image", dtype="|u1", shape=[0, 224, 224, 3], nbytes=0)
    assert decode_tensors(header, [b""]).parts["image"][0].shape == (0, 224, 224, 3)


def test_a_frame_over_the_limit_is_refused_as_too_large_whatever_its_header_says():
    big = np.zeros(MAX_FRAME_BYTES + 1, np.uint8)
    header = pb.BatchHeader()
    header.frames.add(tensor="image", dtype="|u1", shape=[big.size], nbytes=big.nbytes)
    with pytest.raises(FrameError) as err:
        decode_tensors(header, [big.data])
    assert err.value.reason == "frame_too_large" and str(MAX_FRAME_BYTES) in str(err.value)
    header.frames[0].shape[:] = [MAX_FRAME_BYTES]
    header.frames[0].nbytes = MAX_FRAME_BYTES
    assert decode_tensors(header, [big[:-1].data]).nbytes == MAX_FRAME_BYTES  # at the limit: accepted


def test_garbage_header_is_a_frame_error():
    with pytest.raises(FrameError) as err:
        parse_data_message(b"\xff\xff\xff garbage")
    assert err.value.reason == "bad_header"
    with pytest.raises(FrameError):
        parse_data_message(b"")  # parses, but carries no kind
