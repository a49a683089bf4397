"""An ImageNet-like stand-in made from real photographs.

ImageNet-1k's training set has 1,281,167 JPEGs in 1,000 classes (~138 GiB, ~110 KB a file,
mean resolution about 470x390 by the figures quoted in the project's issue; about three
quarters are 500 px on the long side; ~2% are greyscale, a few are CMYK or progressive).
Decode cost depends on image content and size, so each synthetic image is a random crop of a
real photo, rescaled to an ImageNet-like size, colour-jittered, with sensor noise, saved at
an ImageNet-like JPEG quality. `stoker data stats` prints the resulting statistics.
"""

from __future__ import annotations

import io
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter
from tqdm import tqdm

from stoker.pipeline.images.photos import load_photos
from stoker.pipeline.seeds import derived_rng

# The first ten ImageNet-1k synsets (tench, goldfish, great white shark, tiger shark,
# hammerhead, electric ray, stingray, cock, hen, ostrich); further classes get made-up ids.
REAL_WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361", "n01494475",
              "n01496331", "n01498041", "n01514668", "n01514859", "n01518878")


@dataclass(frozen=True)
class SynthConfig:
    images: int = 2000
    classes: int = 10
    seed: int = 0
    long_side: int = 500  # ImageNet's most common long side
    long_side_probability: float = 0.75
    greyscale_fraction: float = 0.02
    cmyk_fraction: float = 0.005
    progressive_fraction: float = 0.05
    quality_mean: float = 92.0
    noise_sigma: tuple[float, float] = (6.0, 16.0)


def wnid(label: int) -> str:
    return REAL_WNIDS[label] if label < len(REAL_WNIDS) else f"n9{label:07d}"


_PHOTOS: list[tuple[str, Image.Image]] = []


def _init_worker() -> None:
    global _PHOTOS
    _PHOTOS = load_photos()


def _output_size(rng: np.random.Generator, cfg: SynthConfig) -> tuple[int, int]:
    if rng.random() < cfg.long_side_probability:
        long_side = cfg.long_side
    else:
        long_side = int(rng.integers(160, 800))
    ratio = float(rng.choice([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9], p=[0.55, 0.2, 0.08, 0.1, 0.07]))
    short_side = max(64, round(long_side / ratio))
    return (long_side, short_side) if rng.random() < 0.78 else (short_side, long_side)


def synth_image(index: int, cfg: SynthConfig) -> tuple[str, bytes]:
    """The JPEG bytes of synthetic image `index`, and its class wnid."""
    rng = derived_rng(cfg.seed, 0, index)
    label = index % cfg.classes
    photo_index = label % len(_PHOTOS) if rng.random() < 0.7 else int(rng.integers(len(_PHOTOS)))
    photo = _PHOTOS[photo_index][1]
    width, height = _output_size(rng, cfg)

    # A random crop of the photo with the output's aspect ratio, 20-100% of the largest one.
    pw, ph = photo.size
    scale = min(pw / width, ph / height) * float(np.sqrt(rng.uniform(0.2, 1.0)))
    cw, ch = max(8, int(width * scale)), max(8, int(height * scale))
    left, top = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
    image = photo.crop((left, top, left + cw, top + ch)).resize((width, height), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if image.mode == "L":
        tint = rng.uniform(0.8, 1.2, size=3)
        grey = np.asarray(image, dtype=np.float32)[..., None]
        image = Image.fromarray(np.clip(grey * tint, 0, 255).astype(np.uint8))
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.75, 1.25))
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.75, 1.25))
    if rng.random() < 0.5:
        image = image.filter(ImageFilter.UnsharpMask(radius=1.5, percent=int(rng.integers(40, 120))))

    # Sensor noise: luminance-correlated Gaussian noise, as a real camera leaves it.
    pixels = np.asarray(image, dtype=np.float32)
    sigma = rng.uniform(*cfg.noise_sigma)
    noise = rng.normal(0.0, sigma, size=pixels.shape[:2] + (1,)) + rng.normal(0.0, sigma / 1.5, size=pixels.shape)
    image = Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))

    draw = rng.random()
    if draw < cfg.greyscale_fraction:
        image = image.convert("L")
    elif draw < cfg.greyscale_fraction + cfg.cmyk_fraction:
        image = image.convert("CMYK")
    quality = int(np.clip(round(rng.normal(cfg.quality_mean, 3.0)), 75, 96))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, progressive=bool(rng.random() < cfg.progressive_fraction))
    return wnid(label), out.getvalue()


def _write_one(args: tuple[int, SynthConfig, str]) -> int:
    index, cfg, folder = args
    name, data = synth_image(index, cfg)
    path = Path(folder) / "train" / name / f"{name}_{index}.JPEG"
    path.write_bytes(data)
    return len(data)


def generate(folder: str | Path, cfg: SynthConfig, processes: int | None = None,
             progress: bool = True) -> int:
    """Write cfg.images JPEGs as `folder/train/<wnid>/<wnid>_<n>.JPEG`; returns bytes written."""
    folder = Path(folder)
    for label in range(cfg.classes):
        (folder / "train" / wnid(label)).mkdir(parents=True, exist_ok=True)
    load_photos()  # fetch the wheels once, before the pool starts
    jobs = [(i, cfg, str(folder)) for i in range(cfg.images)]
    total = 0
    with mp.get_context("spawn").Pool(processes or mp.cpu_count(), initializer=_init_worker) as pool:
        bar = tqdm(total=cfg.images, desc="imagenet-synth", unit="img", disable=not progress)
        for size in pool.imap_unordered(_write_one, jobs, chunksize=8):
            total += size
            bar.update()
        bar.close()
    return total
