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

Worker hosts run `stoker worker`; everything else is in the README. Names are imported on
first use, so `import stoker` (the command line, the worker side) does not import torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["Batch", "ConsumerConfig", "JobConfig", "Loader", "TextConfig"]

_WHERE = {"Batch": "accel.loader", "Loader": "accel.loader", "ConsumerConfig": "accel.consumer_config",
          "JobConfig": "protos.job", "TextConfig": "pipeline.text.examples"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
