"""Stoker: host-side data pipeline service that keeps accelerators fed.

The documented Python surface is this module. A training script (one process per
data-parallel rank, as torchrun starts them) pulls its batches from a `Loader`:

    from stoker import JobConfig, Loader

    loader = Loader(JobConfig(manifest_uri="shards/manifest.json", epochs=2, batch_size=64),
                    device="cuda")
    with loader:
        for epoch in range(loader.epochs):
            for batch in loader:          # this rank's batches, the same number on every rank
                step(batch["image"], batch["label"], rows=batch.rows)

A language model's token stream (`stoker prepare tokens`, then `dataset="tokens"`) sets its rows with
`JobConfig(..., lm=LMConfig(seq_len=512, mode="packed"))`.

A transform of your own (stoker.transforms has the contract) is named, never shipped:

    from stoker import Output, Sample

    class Grey:                       # package.module:Grey, installed on every worker host
        takes = "pixels"              # or "crop" (with crop() and crop_size), or "bytes"
        outputs = {"grey": Output("uint8", (64, 64))}
        def __call__(self, sample: Sample, rng, pixels):
            return {"grey": ...}      # exactly the declared names, dtypes and shapes

    JobConfig(manifest_uri=..., transform="package.module:Grey")   # or --transform package.module:Grey

The errors a training script may catch are here too: `JobFailed` (a worker refused the job),
`RankRefused` and `NotAConsumer` (the dispatcher refused this rank or this process), the
`TransformError` family (a transform that cannot make a job), `CheckpointError` (a data position
that cannot be resumed) and `JobSecretError` / `UntrustedSecret` (the job secret file).

Worker hosts run `stoker worker`; everything else is in the README and docs/. Names are imported on
first use, so `import stoker` (the command line, the worker side) does not import torch; type
checkers read the same names from the imports under TYPE_CHECKING below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first use
_WHERE = {
    "Batch": "stoker.accel.feed", "Loader": "stoker.loader", "ConsumerConfig": "stoker.accel.consumer_config",
    "FleetSeat": "stoker.accel.control.fleet_seat",
    "JobConfig": "stoker.pipeline.job", "TextConfig": "stoker.pipeline.text.examples",
    "LMConfig": "stoker.pipeline.text.lm_layout",
    "Crop": "stoker.pipeline.transforms", "CropFirst": "stoker.pipeline.transforms",
    "ImageTransform": "stoker.pipeline.transforms", "Output": "stoker.pipeline.transforms",
    "Sample": "stoker.pipeline.transforms",
    "StepRecorder": "stoker.accel.step_record",
    # errors a user catches
    "JobFailed": "stoker.accel.consumer", "RankRefused": "stoker.accel.control.remote",
    "NotAConsumer": "stoker.accel.control.remote",
    "TransformError": "stoker.pipeline.transforms", "TransformRefused": "stoker.pipeline.transforms",
    "TransformOutputError": "stoker.pipeline.transforms", "CheckpointError": "stoker.accel.checkpoint",
    "JobSecretError": "stoker.protos.job_secret", "UntrustedSecret": "stoker.protos.job_secret",
    "StokerError": "stoker.protos.errors", "ConfigError": "stoker.protos.errors", "LoaderClosed": "stoker.loader",
    "UncommittedStep": "stoker.accel.feed",
    "DataError": "stoker.protos.errors", "ResourceError": "stoker.protos.errors", "NotFound": "stoker.protos.errors",
    "PeerError": "stoker.protos.errors", "StateError": "stoker.protos.errors",
}
# sorted(_WHERE), spelt out: type checkers and linters read a literal list
__all__ = ["Batch", "CheckpointError", "ConfigError", "ConsumerConfig", "Crop", "CropFirst", "DataError",
           "FleetSeat", "ImageTransform", "JobConfig", "JobFailed", "JobSecretError", "LMConfig", "Loader",
           "LoaderClosed", "NotAConsumer", "NotFound", "Output", "PeerError", "RankRefused", "ResourceError", "Sample",
           "StateError", "StepRecorder",
           "StokerError", "TextConfig", "TransformError", "TransformOutputError", "TransformRefused",
           "UncommittedStep", "UntrustedSecret"]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors; never run
    from stoker.accel.checkpoint import CheckpointError
    from stoker.accel.consumer import JobFailed
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.accel.control.fleet_seat import FleetSeat
    from stoker.accel.control.remote import NotAConsumer, RankRefused
    from stoker.accel.feed import Batch, UncommittedStep
    from stoker.accel.step_record import StepRecorder
    from stoker.loader import Loader, LoaderClosed
    from stoker.pipeline.job import JobConfig
    from stoker.pipeline.text.examples import TextConfig
    from stoker.pipeline.text.lm_layout import LMConfig
    from stoker.pipeline.transforms import (
        Crop,
        CropFirst,
        ImageTransform,
        Output,
        Sample,
        TransformError,
        TransformOutputError,
        TransformRefused,
    )
    from stoker.protos.errors import (
        ConfigError,
        DataError,
        NotFound,
        PeerError,
        ResourceError,
        StateError,
        StokerError,
    )
    from stoker.protos.job_secret import JobSecretError, UntrustedSecret
else:  # hidden from type checkers, so that a misspelt name is an error there and not Any

    def __getattr__(name: str) -> object:
        if name in _WHERE:
            return getattr(importlib.import_module(_WHERE[name]), name)
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
