"""The transform a job names: Stoker's random-resized crop at low resolution, then one TrivialAugment-Wide
operation (FFCV-style training at 176 px: fewer pixels to decode and augment per image).

Crop-first (stoker.transforms): `crop()` is the MLPerf random-resized crop and flip of
`stoker.transforms.TrainTransform`, used as it is, so Stoker decodes only that window, at the
coarsest DCT scale that covers `size`, resized and mirrored. `__call__` gets those pixels and
applies the drawn operation with pillow-simd.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from PIL import Image

from stoker.transforms import REFERENCE_AREA, Crop, Output, Sample, TrainTransform
from stoker_trivialaugment.ops import draw


@dataclass(frozen=True)
class TrivialAugmentWide:
    """`--transform-params`: `size` (the output side, default 176) and the crop's area range
    (`min_area`, `max_area`: MLPerf's reference 0.05-1.0 by default; 0.08 is torchvision's)."""

    size: int = 176
    min_area: float = REFERENCE_AREA[0]
    max_area: float = REFERENCE_AREA[1]
    takes: ClassVar[str] = "crop"
    _crop: TrainTransform = field(init=False, repr=False, compare=False)
    outputs: Mapping[str, Output] = field(init=False, repr=False, compare=False)  # read per sample: made once

    def __post_init__(self) -> None:
        """Parameters that cannot work raise TypeError: what the contract reports, at parse time, as
        parameters this transform does not take (with this text)."""
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise TypeError(f"size must be a whole number of pixels above 0, not {self.size!r}")
        if not 0 < self.min_area <= self.max_area <= 1:
            raise TypeError(f"crop area range {self.min_area}-{self.max_area} must lie in (0, 1]")
        object.__setattr__(self, "_crop", TrainTransform(size=self.size, min_area=self.min_area,
                                                         max_area=self.max_area))
        object.__setattr__(self, "outputs", {"image": Output("uint8", (self.size, self.size, 3))})

    @property
    def crop_size(self) -> int:
        return self.size

    def crop(self, width: int, height: int, rng: random.Random) -> Crop:
        return self._crop.crop(width, height, rng)

    def __call__(self, sample: Sample, rng: random.Random, pixels: np.ndarray | None) -> Mapping[str, np.ndarray]:
        op, magnitude = draw(rng)
        if op.name == "identity":
            return {"image": pixels}  # nothing to do: no copy
        return {"image": np.asarray(op.apply(Image.fromarray(pixels), magnitude))}
