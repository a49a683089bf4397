"""A batch as the consumer holds it: the header and numpy views of the received frames."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stoker.accel.ledger import Skipped
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import ReceivedTensors


@dataclass
class ReceivedBatch:
    """One batch as a rank received and checked it: the header, numpy views of its frames, and
    what the consumer's books need (sender, sample ids, rows it could not decode)."""

    peer: bytes  # ZeroMQ routing id of the sending worker process
    header: pb.BatchHeader
    tensors: ReceivedTensors
    sample_ids: np.ndarray
    received_s: float  # consumer time spent receiving and checking it
    undecodable: list[Skipped] = field(default_factory=list)  # rows whose JPEG failed on the consumer
    ends_epoch: bool = False  # the last batch of its rank's stream this epoch (it may be split: accel.steps)

    @property
    def size(self) -> int:
        """Rows: images, or rows of tokens (a packed row holds several sequences)."""
        return int(self.header.rows)

    @property
    def sequences(self) -> int:
        """Text: the sequences in its rows (more than rows when packed)."""
        return int(self.header.text.sequences)

    @property
    def real_tokens(self) -> int:
        """Text: the tokens that are not padding."""
        return int(self.header.text.real_tokens)

    def tensor(self, name: str) -> np.ndarray:
        """The named tensor whole (a copy only when it arrived in several frames)."""
        return self.tensors.array(name)

    @property
    def has_images(self) -> bool:
        """An image job's batch (a text job's has token tensors instead)."""
        return "image" in self.tensors.parts

    @property
    def images(self) -> np.ndarray:
        """uint8 (n, h, w, 3); a view of the frame unless it arrived split."""
        return self.tensors.array("image")

    @property
    def labels(self) -> np.ndarray:
        """One label per row, as the worker read it from the record."""
        return self.tensors.array("label")

    def split(self, parts: int) -> list[ReceivedBatch]:
        """The batch as `parts` batches of consecutive rows (views, no copies), as equal as can be;
        its sample ids, skips and text statistics ride on the first (text ids are documents).
        Fewer rows than parts leaves the last pieces empty."""
        rows = self.size
        bounds = [rows * i // parts for i in range(parts + 1)]
        pieces = []
        for i in range(parts):
            a, b = bounds[i], bounds[i + 1]
            header = pb.BatchHeader()
            header.CopyFrom(self.header)
            header.rows = b - a
            if i:
                del header.skipped[:]
                header.ClearField("text")
            ids = self.sample_ids[a:b] if self.has_rows_as_samples else (self.sample_ids if i == 0 else
                                                                         self.sample_ids[:0])
            del header.sample_ids[:]
            header.sample_ids.extend(ids.tolist())
            pieces.append(ReceivedBatch(self.peer, header, self.tensors.rows(a, b), ids, 0.0,
                                        undecodable=self.undecodable))  # shared: the whole batch's books close
        return pieces

    @property
    def has_rows_as_samples(self) -> bool:
        """Images: one sample id per row. Text: ids are the documents first seen in the batch."""
        return not self.header.HasField("text")
