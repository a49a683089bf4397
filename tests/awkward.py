"""Awkward but valid JPEGs, as real collections hold them: EXIF-rotated, tiny, greyscale, CMYK, progressive."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
from PIL import Image


def _pixels(width: int, height: int, seed: int) -> np.ndarray:
    """A gradient with noise: never all black, so a black image in a batch is a bug."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 200 // max(width - 1, 1), y * 200 // max(height - 1, 1), (x + y) * 7 % 200], -1) + 30
    return np.clip(base + rng.integers(0, 25, (height, width, 3)), 0, 255).astype(np.uint8)


def encode(width: int, height: int, seed: int, mode: str = "RGB", orientation: int | None = None,
           progressive: bool = False, subsampling: int = 2) -> bytes:
    image = Image.fromarray(_pixels(width, height, seed)).convert(mode)
    options: dict = {"quality": 90, "progressive": progressive}
    if mode != "L":
        options["subsampling"] = subsampling
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation  # Orientation: 2-8 flip and/or rotate on display
        options["exif"] = exif.tobytes()
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def cases() -> list[dict]:
    found = [dict(width=w, height=h, orientation=o) for o in range(2, 9)
             for w, h in ((320, 240), (240, 320), (500, 333), (97, 61), (64, 7))]
    found += [dict(width=w, height=h) for w, h in itertools.product((1, 2, 3, 5, 8, 12), (1, 2, 3, 7, 12))]
    for w, h in ((1, 1), (3, 2), (12, 12), (9, 4), (1, 12)):
        found += [dict(width=w, height=h, mode="L"), dict(width=w, height=h, mode="CMYK"),
                  dict(width=w, height=h, progressive=True), dict(width=w, height=h, subsampling=0),
                  dict(width=w, height=h, subsampling=1, orientation=6), dict(width=w, height=h, orientation=8)]
    return found


def write_awkward_set(folder: str | Path, classes: tuple[str, ...] = ("n01440764", "n01443537")) -> int:
    """An ImageNet-layout folder (train/<wnid>/*.JPEG) of every case; returns the image count."""
    folder = Path(folder)
    every = cases()
    for i, case in enumerate(every):
        target = folder / "train" / classes[i % len(classes)]
        target.mkdir(parents=True, exist_ok=True)
        (target / f"awkward_{i:04d}.JPEG").write_bytes(encode(seed=i, **case))
    return len(every)
