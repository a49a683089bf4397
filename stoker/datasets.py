"""The default dataset: generated and prepared on first use, then reused from the cache."""

from __future__ import annotations

from pathlib import Path

from pipeline.photos import cache_dir
from pipeline.prepare import PrepareConfig, prepare_imagenet
from pipeline.shards import MANIFEST_NAME
from pipeline.synth import SynthConfig, generate

DEFAULT_IMAGES = 2000


def default_imagenet(images: int = DEFAULT_IMAGES, root: Path | None = None, progress: bool = True) -> Path:
    """Path of the manifest of the default ImageNet-like set, making it if needed."""
    base = (root or cache_dir()) / f"imagenet-synth-{images}"
    manifest = base / "shards" / MANIFEST_NAME
    if manifest.exists():
        return manifest
    raw = base / "raw"
    if not (raw / ".complete").exists():
        print(f"stoker: generating the default ImageNet-like set ({images} images) in {raw}", flush=True)
        generate(raw, SynthConfig(images=images), progress=progress)
        (raw / ".complete").touch()
    print(f"stoker: preparing shards in {base / 'shards'}", flush=True)
    prepare_imagenet(raw, base / "shards", PrepareConfig(progress=progress))
    return manifest
