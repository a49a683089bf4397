"""What kinds of dataset Stoker feeds, each described once.

A `DatasetKind` holds what the rest of the house needs to know about a dataset: its batch
layout, its worker stages, what its samples and rows are called, whether a unit's batches are
known from the plan, which accelerator rate it consumes, what training its model takes (for
`stoker plan`), and how its experiments shrink an accelerator to a small machine. A manifest names its kind
(`Manifest.kind`), a job names it (`JobConfig.dataset`), and everyone else asks `kind_of`.
Adding a dataset is a pipeline module for its shards, layout and batches, its entry here, and
its batch source on the worker side (`stoker/workers/sources.py`, which may not import from stoker/accel/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from stoker.pipeline.images import layout as image_layout
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.tensors import BatchLayout
from stoker.pipeline.text import layout as text_layout
from stoker.pipeline.text import lm_layout
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.transforms import Resolved
from stoker.protos.errors import ConfigError


class LaidOutJob(Protocol):
    """What a batch layout reads of a job (pipeline.job.JobConfig), named here so that kinds,
    which the job imports, does not import the job back."""

    @property
    def image_size(self) -> int: ...

    @property
    def decode_on(self) -> DecodeOn: ...

    @property
    def text(self) -> TextConfig: ...

    @property
    def lm(self) -> LMConfig: ...

    def image_transform(self) -> Resolved: ...


class ModelFamily(StrEnum):
    """What trains on a kind: the built-in torch models, and the rate an accelerator profile quotes."""

    RESNET50 = "resnet50"
    BERT = "bert"
    GPT = "gpt"


@dataclass(frozen=True)
class Workload:
    """The samples that train a kind's model to its target quality (`stoker plan`, a sweep's time-to-train)."""

    samples: float
    source: str


@dataclass(frozen=True)
class SmallScale:
    """How a kind's experiments shrink a quoted accelerator rate so a small machine can feed it."""

    run: float  # `stoker run`'s simulated A100, as a share of its rate
    sweep: float  # `stoker sweep`'s simulated system (an IPU-POD16 by default)
    sweep_cores: tuple[float, ...]  # the cores per host a sweep tries


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
    model_family: ModelFamily
    layout: Callable[[LaidOutJob], BatchLayout]  # of a job
    workload: Workload
    small_scale: SmallScale
    pod16_over_dgx: float  # Graphcore's published performance per dollar, IPU-POD16 over DGX A100


def _image_layout(job: LaidOutJob) -> BatchLayout:
    if job.decode_on == DecodeOn.ACCELERATOR:
        return BatchLayout(image_layout.tensor_specs(job.image_size, job.decode_on), rows_are_samples=True,
                           ragged=image_layout.RAGGED)
    return BatchLayout(image_layout.transformed_specs(job.image_transform().outputs), rows_are_samples=True)


def _text_layout(job: LaidOutJob) -> BatchLayout:
    return BatchLayout(text_layout.tensor_specs(job.text), rows_are_samples=False)


def _lm_layout(job: LaidOutJob) -> BatchLayout:
    return BatchLayout(lm_layout.tensor_specs(job.lm), rows_are_samples=False)


# MLPerf's reference convergence: ResNet-50 v1.5 reaches 75.9% top-1 in about 35-44 epochs of
# ImageNet's 1,281,167 training images depending on the global batch size (quoted in this
# project's planning issue); 40 is the default. BERT-large: ~2.5-3.0 M samples at length 512
# in MLPerf v1.0 logs; 2.75 M is the default. The published ratios are quoted in the same issue.
IMAGENET_TRAIN_IMAGES = 1_281_167
IMAGENET = DatasetKind("imagenet", sample_noun="samples", row_noun="images", progress_unit="img",
                       stages=("read", "decode", "augment"), one_row_per_sample=True, encoded_images=True, text=False,
                       model_family=ModelFamily.RESNET50, layout=_image_layout,
                       workload=Workload(IMAGENET_TRAIN_IMAGES * 40,
                                         "ResNet-50: 40 epochs of 1,281,167 images (MLPerf reference range 35-44)"),
                       small_scale=SmallScale(run=0.1, sweep=0.03, sweep_cores=(0.25, 0.5)),  # 250 img/s; 780 img/s
                       pod16_over_dgx=1.6)
WIKIPEDIA = DatasetKind("wikipedia", sample_noun="documents", row_noun="sequences", progress_unit="doc",
                        stages=("examples", "pack"), one_row_per_sample=False, encoded_images=False, text=True,
                        model_family=ModelFamily.BERT, layout=_text_layout,
                        workload=Workload(2_750_000,
                                          "BERT-large: 2.75 M sequences at length 512 (MLPerf v1.0 logs: 2.5-3.0 M)"),
                        small_scale=SmallScale(run=1.0, sweep=1.0, sweep_cores=(0.05, 0.1, 0.2)),  # 210; 1,300 seq/s
                        pod16_over_dgx=1.3)
# GPT-2 124M as nanoGPT reproduces it: ~300 B tokens (600,000 steps of ~0.5 M tokens), 293 M rows of 1,024.
# No published IPU-POD16 over DGX A100 figure for it: 1.0, the sweep's ratio left neutral.
TOKENS = DatasetKind("tokens", sample_noun="documents", row_noun="sequences", progress_unit="doc",
                     stages=("pack",), one_row_per_sample=False, encoded_images=False, text=True,
                     model_family=ModelFamily.GPT, layout=_lm_layout,
                     workload=Workload(293_000_000, "GPT-2 124M: ~300 B tokens at length 1,024 (nanoGPT)"),
                     small_scale=SmallScale(run=1.0, sweep=1.0, sweep_cores=(0.05, 0.1, 0.2)),
                     pod16_over_dgx=1.0)
KINDS: dict[str, DatasetKind] = {kind.name: kind for kind in (IMAGENET, WIKIPEDIA, TOKENS)}


def kind_of(name: str) -> DatasetKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"dataset must be one of {', '.join(KINDS)}, not {name!r}") from None
