"""A batch as the consumer holds it: the header and numpy views of the received frames."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from accel.ledger import Skipped
from protos import stoker_pb2 as pb
from protos.framing import ReceivedTensors


@dataclass
class ReceivedBatch:
    peer: bytes  # ZeroMQ routing id of the sending worker process
    header: pb.BatchHeader
    tensors: ReceivedTensors
    sample_ids: np.ndarray
    received_s: float  # consumer time spent receiving and checking it
    undecodable: list[Skipped] = field(default_factory=list)  # rows whose JPEG failed on the consumer

    @property
    def size(self) -> int:
        """Rows: images, or rows of tokens (a packed row holds several sequences)."""
        return int(self.header.rows)

    @property
    def sequences(self) -> int:
        return int(self.header.text.sequences)

    @property
    def real_tokens(self) -> int:
        return int(self.header.text.real_tokens)

    def tensor(self, name: str) -> np.ndarray:
        return self.tensors.array(name)

    @property
    def has_images(self) -> bool:
        return "image" in self.tensors.parts

    @property
    def images(self) -> np.ndarray:
        """uint8 (n, h, w, 3); a view of the frame unless it arrived split."""
        return self.tensors.array("image")

    @property
    def labels(self) -> np.ndarray:
        return self.tensors.array("label")
