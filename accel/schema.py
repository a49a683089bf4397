"""What a job's batches must look like on the wire, checked before a batch is queued.

Every tensor the job's layout names must arrive, with its dtype and per-row shape, and with
`header.rows` rows in all; nothing else may ride along. Image batches also need one sample
id per row. A batch that breaks this is dropped and counted (`size_mismatch`), so a model
never sees a silently wrong batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accel.job import JobConfig
from pipeline.text.layout import TensorSpec, tensor_specs
from protos import stoker_pb2 as pb
from protos.framing import FrameError


@dataclass(frozen=True)
class BatchSchema:
    tensors: dict[str, TensorSpec]
    rows_are_samples: bool  # images: one sample id per row

    def check(self, header: pb.BatchHeader, parts: dict[str, list[np.ndarray]]) -> None:
        rows = header.rows
        if self.rows_are_samples and rows != len(header.sample_ids):
            raise FrameError("size_mismatch", f"{rows} rows for {len(header.sample_ids)} sample ids")
        if not rows:
            if parts:
                raise FrameError("size_mismatch", "an empty batch carries tensors")
            return
        extra = set(parts) - set(self.tensors)
        missing = set(self.tensors) - set(parts)
        if extra or missing:
            raise FrameError("size_mismatch", f"tensors {sorted(parts)} are not {sorted(self.tensors)}")
        for name, spec in self.tensors.items():
            count = 0
            for part in parts[name]:
                if part.ndim != len(spec.shape) + 1 or part.shape[1:] != spec.shape or part.dtype.str != spec.dtype:
                    raise FrameError("size_mismatch", f"{name}: {part.dtype.str}{list(part.shape)} is not "
                                                      f"{spec.dtype}[rows, {', '.join(map(str, spec.shape))}]")
                count += part.shape[0]
            if count != rows:
                raise FrameError("size_mismatch", f"{name}: {count} rows, header says {rows}")


def schema_of(job: JobConfig) -> BatchSchema:
    if job.dataset == "wikipedia":
        return BatchSchema(tensor_specs(job.text), rows_are_samples=False)
    size = job.image_size
    return BatchSchema({"image": TensorSpec("|u1", (size, size, 3)), "label": TensorSpec("<i4", ())},
                       rows_are_samples=True)
