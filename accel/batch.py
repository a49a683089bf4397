"""A batch as the consumer holds it: the header and numpy views of the received frames."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protos import stoker_pb2 as pb
from protos.framing import ReceivedTensors


@dataclass
class ReceivedBatch:
    peer: bytes  # ZeroMQ routing id of the sending worker process
    header: pb.BatchHeader
    tensors: ReceivedTensors
    sample_ids: np.ndarray
    received_s: float  # consumer time spent receiving and checking it

    @property
    def size(self) -> int:
        return int(self.sample_ids.size)

    @property
    def images(self) -> np.ndarray:
        """uint8 (n, h, w, 3); a view of the frame unless it arrived split."""
        return self.tensors.array("image")

    @property
    def labels(self) -> np.ndarray:
        return self.tensors.array("label")
