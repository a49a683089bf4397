"""TrivialAugment-Wide's operations over pillow-simd, and the one random draw per image.

The wide space (Müller & Hutter 2021, table 1; torchvision's TrivialAugmentWide): 14 operations,
each with its strength in 31 bins from nothing to the most. Per image one operation is drawn
uniformly, then one bin uniformly, then (for a signed operation) a sign. Every draw comes from
the generator passed in, so a sample made again elsewhere comes out the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image, ImageEnhance, ImageOps

NUM_BINS = 31
FILL = (0, 0, 0)  # where a geometric operation maps no pixel (torchvision's default fill)
NEAREST = Image.Resampling.NEAREST  # torchvision's default interpolation for TrivialAugment
AFFINE = Image.Transform.AFFINE


@dataclass(frozen=True)
class Op:
    """One operation: `apply(image, magnitude)`, its magnitude at the top bin and whether it takes a sign.
    `top` None: the operation has no strength (identity, autocontrast, equalize)."""

    name: str
    apply: Callable[[Image.Image, float], Image.Image]
    top: float | None = None
    signed: bool = False
    bottom: float = 0.0  # the magnitude at bin 0 (posterize and solarize count down)
    whole: bool = False  # rounded to a whole number (posterize's bits)

    def magnitude(self, index: int) -> float:
        """Bin `index` of NUM_BINS, evenly spaced from `bottom` to `top`."""
        if self.top is None:
            return 0.0
        value = self.bottom + (self.top - self.bottom) * index / (NUM_BINS - 1)
        return float(round(value)) if self.whole else value


def _affine(matrix: Callable[[float], tuple[float, ...]]) -> Callable[[Image.Image, float], Image.Image]:
    """An affine map about the top-left corner: PIL's coefficients take output to input pixels."""
    return lambda image, m: image.transform(image.size, AFFINE, matrix(m), resample=NEAREST, fillcolor=FILL)


def _enhance(kind: type) -> Callable[[Image.Image, float], Image.Image]:
    """PIL's enhancers blend towards a degenerate image: factor 1 is the image itself."""
    return lambda image, m: kind(image).enhance(1.0 + m)


def _posterize(image: Image.Image, bits: float) -> Image.Image:
    return ImageOps.posterize(image, int(bits))


OPS: tuple[Op, ...] = (
    Op("identity", lambda image, m: image),
    Op("shear_x", _affine(lambda m: (1, m, 0, 0, 1, 0)), 0.99, True),
    Op("shear_y", _affine(lambda m: (1, 0, 0, m, 1, 0)), 0.99, True),
    Op("translate_x", _affine(lambda m: (1, 0, m, 0, 1, 0)), 32.0, True),  # pixels, as in the wide space
    Op("translate_y", _affine(lambda m: (1, 0, 0, 0, 1, m)), 32.0, True),
    Op("rotate", lambda image, m: image.rotate(m, resample=NEAREST, fillcolor=FILL), 135.0, True),
    Op("brightness", _enhance(ImageEnhance.Brightness), 0.99, True),
    Op("color", _enhance(ImageEnhance.Color), 0.99, True),
    Op("contrast", _enhance(ImageEnhance.Contrast), 0.99, True),
    Op("sharpness", _enhance(ImageEnhance.Sharpness), 0.99, True),
    Op("posterize", _posterize, 2.0, bottom=8.0, whole=True),  # 8 bits down to 2: torchvision's 8 - round(bin / 5)
    Op("solarize", lambda image, m: ImageOps.solarize(image, m), 0.0, bottom=255.0),  # invert at or above m
    Op("autocontrast", lambda image, m: ImageOps.autocontrast(image)),
    Op("equalize", lambda image, m: ImageOps.equalize(image)),
)


def draw(rng: random.Random) -> tuple[Op, float]:
    """One operation uniformly, one of its NUM_BINS strengths uniformly, a sign by a coin (signed ones)."""
    op = OPS[rng.randrange(len(OPS))]
    if op.top is None:
        return op, 0.0
    magnitude = op.magnitude(rng.randrange(NUM_BINS))
    if op.signed and rng.random() < 0.5:
        magnitude = -magnitude
    return op, magnitude
