"""How a batch's tensor is described on the wire, for every dataset's layout."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # numpy dtype string as it travels
    shape: tuple[int, ...]  # per row (a ragged tensor: () and one flat run of elements)


@dataclass(frozen=True)
class BatchLayout:
    """Every tensor a dataset's batch carries, and how its rows relate to samples."""

    tensors: dict[str, TensorSpec]
    rows_are_samples: bool  # one sample id per row (images); text rows hold parts of several documents
    ragged: dict[str, str] = field(default_factory=dict)  # flat tensor -> the tensor of its rows' end offsets
