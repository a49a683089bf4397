"""Size and format statistics of an ImageNet-layout folder, read from JPEG headers only."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from stoker.protos.errors import DataError


@dataclass
class ImageStats:
    images: int
    total_bytes: int
    mean_bytes: float
    mean_width: float
    mean_height: float
    long_side_500_fraction: float
    greyscale_fraction: float
    cmyk_fraction: float
    progressive_fraction: float

    def as_dict(self) -> dict:
        return asdict(self)


def image_files(root: str | Path) -> list[Path]:
    """Every file below `root/train/<class>/` (or `root/<class>/`), sorted."""
    root = Path(root)
    base = root / "train" if (root / "train").is_dir() else root
    return sorted(p for p in base.glob("*/*") if p.is_file())


def folder_stats(root: str | Path) -> ImageStats:
    sizes, widths, heights, modes, progressive = [], [], [], [], []
    for path in image_files(root):
        with Image.open(path) as image:
            widths.append(image.size[0])
            heights.append(image.size[1])
            modes.append(image.mode)
            progressive.append(bool(image.info.get("progressive") or image.info.get("progression")))
        sizes.append(path.stat().st_size)
    if not sizes:
        raise DataError(f"no images below {root}")
    w, h = np.array(widths), np.array(heights)
    return ImageStats(
        images=len(sizes), total_bytes=int(sum(sizes)), mean_bytes=float(np.mean(sizes)),
        mean_width=float(w.mean()), mean_height=float(h.mean()),
        long_side_500_fraction=float(np.mean(np.maximum(w, h) == 500)),
        greyscale_fraction=modes.count("L") / len(modes), cmyk_fraction=modes.count("CMYK") / len(modes),
        progressive_fraction=float(np.mean(progressive)))
