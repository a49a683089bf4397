"""Multipart framing: [DataMessage header, raw tensor frames...].

Tensors travel as raw buffers (sent with copy=False, read back as numpy views of the
received frames, never pickled). A tensor larger than MAX_FRAME_BYTES is split along its
first axis: glibc serves allocations above its 32 MiB mmap-threshold ceiling with fresh
mmaps, which halves throughput. So one row must fit a frame, and a batch at most MAX_FRAMES
frames (protos.message_fit refuses a job whose batches would not); a frame that arrives over
the limit anyway is refused as `frame_too_large`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import numpy as np

from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError, PeerError

MAX_FRAME_BYTES = 32 * 1024 * 1024 - 64 * 1024
MAX_HEADER_BYTES = 1 << 20
MAX_FRAMES = 64
MAX_DIMENSIONS = 8  # the widest tensor Stoker sends has 4 (rows, height, width, channels)
ALLOWED_DTYPES = frozenset({"|u1", "|i1", "|b1", "<u2", "<i2", "<i4", "<u4", "<i8", "<f2", "<f4", "<f8"})


class FrameError(PeerError, ValueError):
    """A message that does not follow the protocol; `reason` labels the drop counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _buffer(frame: object) -> memoryview:
    """The bytes of a zmq.Frame, bytes or buffer, without copying."""
    buf = getattr(frame, "buffer", frame)
    return memoryview(buf).cast("B")  # type: ignore[arg-type]


def frame_bytes(frame: object) -> bytes:
    """The bytes of a small frame (routing id, control message), whatever its type."""
    return bytes(_buffer(frame))


def parse_data_message(frame: object) -> pb.DataMessage:
    data = _buffer(frame)
    if len(data) > MAX_HEADER_BYTES:
        raise FrameError("bad_header", f"header of {len(data)} bytes exceeds {MAX_HEADER_BYTES}")
    message = pb.DataMessage()
    try:
        # types-protobuf says bytes; the upb parser takes any buffer, and a memoryview saves the copy
        message.ParseFromString(data)  # type: ignore[arg-type]
    except Exception as exc:  # protobuf's DecodeError and friends
        raise FrameError("bad_header", str(exc)) from exc
    if message.WhichOneof("kind") is None:
        raise FrameError("bad_header", "message has no kind")
    return message


def rows_per_frame(row_bytes: int, max_frame_bytes: int = MAX_FRAME_BYTES) -> int:
    """How many rows of a tensor `encode_tensors` puts in one frame (one at least, even one too big)."""
    return max(1, max_frame_bytes // max(row_bytes, 1))


def encode_tensors(header: pb.BatchHeader, tensors: dict[str, np.ndarray], checksum: bool,
                   max_frame_bytes: int = MAX_FRAME_BYTES) -> list[np.ndarray]:
    """Fill header.frames (and the CRC-32C) and return the tensor frames to send after it."""
    frames: list[np.ndarray] = []
    crc = 0
    del header.frames[:]
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = array.dtype.str
        if dtype not in ALLOWED_DTYPES:
            raise ConfigError(f"tensor {name}: dtype {dtype} cannot travel")
        rows = array.shape[0] if array.ndim else 1
        per_frame = rows_per_frame(array.nbytes // rows if rows else array.nbytes, max_frame_bytes)
        pieces = [array] if rows <= per_frame else [array[i:i + per_frame] for i in range(0, rows, per_frame)]
        for piece in pieces:
            header.frames.add(tensor=name, dtype=dtype, shape=list(piece.shape), nbytes=piece.nbytes)
            if checksum:
                crc = crc32c.crc32c(piece.data, crc)
            frames.append(piece)
    header.has_crc32c = checksum
    header.crc32c = crc if checksum else 0
    return frames


@dataclass
class ReceivedTensors:
    """Tensors of a received batch: per name, the numpy views of its frames in order."""

    parts: dict[str, list[np.ndarray]]
    nbytes: int

    def array(self, name: str) -> np.ndarray:
        """The whole tensor; a copy only when it arrived in several frames."""
        parts = self.parts[name]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rows(self, start: int, stop: int) -> ReceivedTensors:
        """Rows [start, stop) of every tensor (views). A ragged tensor (`X` with row ends `X_end`,
        as JPEG bytes travel) is cut at its row ends."""
        parts: dict[str, list[np.ndarray]] = {}
        for name in self.parts:
            if f"{name}_end" in self.parts:
                ends = self.array(f"{name}_end")
                first = int(ends[start - 1]) if start else 0
                last = int(ends[stop - 1]) if stop > start else first
                parts[name] = [self.array(name)[first:last]]
            elif name.endswith("_end") and name[:-4] in self.parts:
                ends = self.array(name)
                first = int(ends[start - 1]) if start else 0
                parts[name] = [ends[start:stop] - first]
            else:
                parts[name] = [self.array(name)[start:stop]]
        return ReceivedTensors(parts, sum(p.nbytes for arrays in parts.values() for p in arrays))


def decode_tensors(header: pb.BatchHeader, frames: Sequence[object]) -> ReceivedTensors:
    """Check every frame against the header and view it as numpy; raise FrameError if off."""
    if len(frames) != len(header.frames):
        raise FrameError("frame_count", f"header declares {len(header.frames)} frames, got {len(frames)}")
    if len(frames) > MAX_FRAMES:
        raise FrameError("frame_count", f"{len(frames)} frames exceed {MAX_FRAMES}")
    for spec, frame in zip(header.frames, frames, strict=True):
        if len(_buffer(frame)) > MAX_FRAME_BYTES:
            raise FrameError("frame_too_large", f"{spec.tensor}: a frame of {len(_buffer(frame))} bytes exceeds "
                             f"{MAX_FRAME_BYTES}")
    parts: dict[str, list[np.ndarray]] = {}
    crc = 0
    total = 0
    for spec, frame in zip(header.frames, frames, strict=True):
        if spec.dtype not in ALLOWED_DTYPES:
            raise FrameError("bad_dtype", f"dtype {spec.dtype!r} is not allowed")
        if any(d < 0 for d in spec.shape):
            raise FrameError("size_mismatch", f"negative dimension in {list(spec.shape)}")
        dtype = np.dtype(spec.dtype)
        if len(spec.shape) > MAX_DIMENSIONS or math.prod(d for d in spec.shape if d) * dtype.itemsize > MAX_FRAME_BYTES:
            # an empty tensor's other dimensions are still sizes numpy must hold: (0, 2**40, 2**40) is no frame
            raise FrameError("size_mismatch", f"{spec.tensor}: shape {list(spec.shape)} x {dtype} cannot fit a frame")
        expected = math.prod(spec.shape) * dtype.itemsize
        data = _buffer(frame)
        if expected != spec.nbytes or len(data) != expected:
            raise FrameError("size_mismatch", f"{spec.tensor}: shape {list(spec.shape)} x {dtype} is "
                             f"{expected} bytes, header says {spec.nbytes}, frame has {len(data)}")
        if header.has_crc32c:
            crc = crc32c.crc32c(data, crc)
        total += len(data)
        parts.setdefault(spec.tensor, []).append(np.frombuffer(data, dtype=dtype).reshape(tuple(spec.shape)))
    if header.has_crc32c and crc != header.crc32c:
        raise FrameError("checksum", f"crc32c {crc:#010x} != header {header.crc32c:#010x}")
    return ReceivedTensors(parts, total)
