"""A JPEG set of ImageNet's geometry made of camera photos the project did not take or generate.

The photographs are the camera photos that ship on PyPI: OpenCV's sample data (from the opencv-python
source archive benchmarks.opencv_samples fetches and checks), scikit-image's, scikit-learn's, matplotlib's and
imgaug's (their wheels, pinned). Each file of the set is one photo cut to an ImageNet aspect and size
and re-encoded as a camera or a photo site would: libjpeg-turbo through Pillow, baseline, 4:2:0
chroma at most qualities, no noise or colour change (the project's own generator, synth.py, adds
both). ImageNet-1k's training files have a median of 500 x 375 and about 110 KB; about three quarters
are 500 px on the long side. The set is built under benchmarks/work/photos, never committed.

    python -m benchmarks.photo_set        # builds it and prints its statistics
"""

from __future__ import annotations

import io
import json
import random
import statistics
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from PIL import Image

from benchmarks.opencv_samples import SAMPLES, fetch_archive
from benchmarks.suite import WORK
from stoker.pipeline.images.photos import load_photos
from stoker.pipeline.store.wheels import WheelSource, cache_dir, fetch_wheel

FOLDER = WORK / "photos"
IMAGES = 2_000
CLASSES = 10
SEED = 2026
# OpenCV's sample JPEGs that are camera photographs (not drawings, logos, renders or calibration boards).
OPENCV_PHOTOS = ("aero1", "aero3", "aloeL", "apple", "baboon", "building", "butterfly", "ela_original",
                 "fruits", "home", "lena", "leuvenA", "leuvenB", "messi5", "orange", "squirrel_cls")
# The wheel photos load_photos reads that are not camera photographs of a scene.
NOT_CAMERA = ("hubble_deep_field", "ihc", "retina")
IMGAUG = WheelSource("imgaug==0.4.0", "imgaug-")
# ImageNet's shapes: (long side, short side / long side, weight). Three quarters are 500 px long.
SHAPES = ((500, 0.75, 0.42), (500, 0.666, 0.20), (500, 0.8, 0.06), (500, 0.5625, 0.07),
          (400, 0.75, 0.06), (640, 0.75, 0.06), (333, 0.75, 0.05), (800, 0.6, 0.04), (250, 0.75, 0.04))
PORTRAIT = 0.2
QUALITIES = ((85, 0.10), (90, 0.25), (92, 0.15), (95, 0.35), (97, 0.15))
FULL_CHROMA = 0.2  # share saved 4:4:4 (many cameras and editors), the rest 4:2:0


def camera_photos() -> list[tuple[str, Image.Image]]:
    """Every source photograph, RGB or L."""
    photos = [(name, image) for name, image in load_photos() if name not in NOT_CAMERA]
    with tarfile.open(fetch_archive()) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            stem = Path(member.name).stem
            if member.isfile() and SAMPLES.match(member.name) and stem in OPENCV_PHOTOS:
                source = archive.extractfile(member)
                assert source is not None
                photos.append((stem, _opened(source.read())))
    with zipfile.ZipFile(fetch_wheel(IMGAUG, cache_dir() / "wheels")) as wheel:
        photos.append(("quokka", _opened(wheel.read("imgaug/quokka.jpg"))))
    return photos


def _opened(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    return image.convert("L" if image.mode == "L" else "RGB")


def _pick(rng: random.Random, table: tuple) -> tuple:
    return rng.choices(table, weights=[row[-1] for row in table])[0]


def one_file(photo: Image.Image, rng: random.Random) -> bytes:
    """A random window of `photo` of an ImageNet shape, resized to it and saved at a usual quality."""
    long_side, ratio, _ = _pick(rng, SHAPES)
    width, height = long_side, round(long_side * ratio)
    if rng.random() < PORTRAIT:
        width, height = height, width
    scale = min(photo.width / width, photo.height / height) * rng.uniform(0.55, 1.0)
    box_w, box_h = width * scale, height * scale
    left, top = rng.uniform(0, photo.width - box_w), rng.uniform(0, photo.height - box_h)
    cut = photo.resize((width, height), Image.Resampling.LANCZOS, box=(left, top, left + box_w, top + box_h))
    quality = _pick(rng, QUALITIES)[0]
    out = io.BytesIO()
    cut.save(out, "JPEG", quality=quality, subsampling=0 if rng.random() < FULL_CHROMA else 2)
    return out.getvalue()


def build() -> tuple[list[Path], str]:
    """(the JPEG files, the manifest of their shards), made once under benchmarks/work/photos."""
    raw, shards = FOLDER / "raw" / "train", FOLDER / "shards"
    if not (shards / "manifest.json").exists():
        photos, rng = camera_photos(), random.Random(SEED)
        for index in range(IMAGES):
            name, photo = photos[index % len(photos)]
            target = raw / f"n{index % CLASSES:08d}" / f"{name}_{index:05d}.JPEG"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(one_file(photo, rng))
        subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(raw.parent), str(shards)],
                       check=True, capture_output=True)
    return sorted(raw.glob("*/*.JPEG")), str(shards / "manifest.json")


def statistics_of(files: list[Path]) -> dict:
    """Median size, bytes and pixels of the set, and the share 500 px on the long side."""
    sizes = [Image.open(f).size for f in files]
    return {"files": len(files), "sources": len({f.name.rsplit("_", 1)[0] for f in files}),
            "median_width": statistics.median(w for w, _ in sizes),
            "median_height": statistics.median(h for _, h in sizes),
            "median_kb": statistics.median(f.stat().st_size for f in files) / 1000,
            "mean_kb": statistics.mean(f.stat().st_size for f in files) / 1000,
            "long_side_500": sum(max(s) == 500 for s in sizes) / len(sizes)}


if __name__ == "__main__":
    built, _ = build()
    print(json.dumps(statistics_of(built)))
