"""What a job's batches must look like on the wire, checked before a batch is queued.

Every tensor the job's layout names must arrive, with its dtype and per-row shape, and with
`header.rows` rows in all; nothing else may ride along. Image batches also need one sample
id per row. A ragged tensor (the JPEG bytes when decoding on the accelerator) is one flat
run of elements whose row boundaries another tensor gives: those ends must rise and the last
must be the run's length. A batch that breaks this is dropped and counted (`size_mismatch`), so a model
never sees a silently wrong batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.pipeline.job import JobConfig
from stoker.pipeline.tensors import BatchLayout, TensorSpec
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import FrameError


@dataclass(frozen=True)
class BatchSchema(BatchLayout):
    """A dataset kind's `BatchLayout`, enforced on every received batch."""

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
            if name in self.ragged:
                continue
            count = 0
            for part in parts[name]:
                if part.ndim != len(spec.shape) + 1 or part.shape[1:] != spec.shape or part.dtype.str != spec.dtype:
                    raise FrameError("size_mismatch", f"{name}: {part.dtype.str}{list(part.shape)} is not "
                                                      f"{spec.dtype}[rows, {', '.join(map(str, spec.shape))}]")
                count += part.shape[0]
            if count != rows:
                raise FrameError("size_mismatch", f"{name}: {count} rows, header says {rows}")
        for name, ends in self.ragged.items():  # after the row checks: the ends are known well-formed here
            self._check_ragged(name, self.tensors[name], parts[name], np.concatenate(parts[ends]))

    def empty(self) -> dict[str, np.ndarray]:
        """Zero-row arrays of every tensor: what a step of an empty batch gives, which travels without tensors."""
        return {name: np.empty((0, *spec.shape), dtype=np.dtype(spec.dtype)) for name, spec in self.tensors.items()}

    @staticmethod
    def _check_ragged(name: str, spec: TensorSpec, parts: list[np.ndarray], ends: np.ndarray) -> None:
        if any(part.ndim != 1 or part.dtype.str != spec.dtype for part in parts):
            raise FrameError("size_mismatch", f"{name}: must be flat {spec.dtype}")
        total = sum(part.shape[0] for part in parts)
        if ends.size and (ends[0] < 0 or np.any(np.diff(ends) < 0) or ends[-1] != total):
            raise FrameError("size_mismatch", f"{name}: row ends do not rise to its {total} elements")


def schema_of(job: JobConfig) -> BatchSchema:
    layout = job.kind.layout(job)
    return BatchSchema(layout.tensors, layout.rows_are_samples, layout.ragged)


AVERAGE_JPEG_BYTES = 150_000  # a generous ImageNet mean (~110 KB): what a batch of encoded images weighs


def batch_bytes(job: JobConfig) -> int:
    """About how many bytes one full batch of the job weighs on the wire (for credit budgets)."""
    schema = schema_of(job)
    if "jpeg" in schema.tensors:
        return job.batch_size * (AVERAGE_JPEG_BYTES + 32)
    total = 0
    for spec in schema.tensors.values():
        count = 1
        for dim in spec.shape:
            count *= dim
        total += count * np.dtype(spec.dtype).itemsize
    return job.batch_size * total
