"""What a transform author needs, in one public module: the contract a transform keeps, the types
it declares and receives, the errors it may raise, and the built-in crops to compose.

    from stoker.transforms import Output, Sample, TrainTransform

A transform is any object with `takes`, `outputs` and `__call__(sample, rng, pixels)` (and
`crop(width, height, rng)` plus `crop_size` when it takes "crop"): docs/transforms.md says what
each means. The names here are the ones the workers use; this module only gathers them.
"""

from __future__ import annotations

from stoker.pipeline.images.augment import REFERENCE_AREA, EvalTransform, TrainTransform
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

__all__ = ["REFERENCE_AREA", "Crop", "CropFirst", "EvalTransform", "ImageTransform", "Output", "Sample",
           "TrainTransform", "TransformError", "TransformOutputError", "TransformRefused"]
