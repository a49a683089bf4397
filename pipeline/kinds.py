"""What kinds of dataset Stoker feeds, each described once.

A `DatasetKind` holds what the rest of the house needs to know about a dataset: its batch
layout, its worker stages, what its samples and rows are called, whether a unit's batches are
known from the plan, and which accelerator rate it consumes. A manifest names its kind
(`Manifest.kind`), a job names it (`JobConfig.dataset`), and everyone else asks `kind_of`.
Adding a dataset is a pipeline module for its shards, layout and batches, its entry here, and
its batch source on the worker side (`workers/sources.py`, which may not import from accel/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline import image_layout
from pipeline.tensors import BatchLayout
from pipeline.text import layout as text_layout


@dataclass(frozen=True)
class DatasetKind:
    name: str
    sample_noun: str  # what one sample is called in summaries: "samples", "documents"
    row_noun: str  # what the device trains on per row: "images", "sequences"
    progress_unit: str  # the progress bar's unit
    stages: tuple[str, ...]  # the worker's stages, as a batch header's `stages` names them
    one_row_per_sample: bool  # a unit's batches are known from the plan; rows past whole batches can be dropped
    encoded_images: bool  # JPEG bytes: may be decoded on the accelerator instead of the host
    text: bool  # rows are token sequences: summaries and metrics count sequences, tokens and padding
    model_family: str  # what trains on it: the built-in torch models, and the rate a profile quotes (resnet50, bert)
    layout: Callable[[Any], BatchLayout]  # of a job (duck-typed: pipeline does not know protos.job)


def _image_layout(job: Any) -> BatchLayout:
    ragged = image_layout.RAGGED if job.decode_on == "accelerator" else {}
    return BatchLayout(image_layout.tensor_specs(job.image_size, job.decode_on), rows_are_samples=True,
                       ragged=ragged)


def _text_layout(job: Any) -> BatchLayout:
    return BatchLayout(text_layout.tensor_specs(job.text), rows_are_samples=False)


IMAGENET = DatasetKind("imagenet", sample_noun="samples", row_noun="images", progress_unit="img",
                       stages=("decode", "augment"), one_row_per_sample=True, encoded_images=True, text=False,
                       model_family="resnet50", layout=_image_layout)
WIKIPEDIA = DatasetKind("wikipedia", sample_noun="documents", row_noun="sequences", progress_unit="doc",
                        stages=("examples", "pack"), one_row_per_sample=False, encoded_images=False, text=True,
                        model_family="bert", layout=_text_layout)
KINDS: dict[str, DatasetKind] = {kind.name: kind for kind in (IMAGENET, WIKIPEDIA)}


def kind_of(name: str) -> DatasetKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"dataset must be one of {', '.join(KINDS)}, not {name!r}") from None
