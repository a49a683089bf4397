"""The default datasets: fetched or generated and prepared on first use, then reused from the cache."""

from __future__ import annotations

from pathlib import Path

from stoker.pipeline.images.synth import SynthConfig, generate
from stoker.pipeline.kinds import IMAGENET, WIKIPEDIA, kind_of
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.store.shards import MANIFEST_NAME, MANIFEST_VERSION, Manifest
from stoker.pipeline.store.stats import image_files
from stoker.pipeline.store.wheels import cache_dir
from stoker.pipeline.text.corpus import write_wikipedia
from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia

DEFAULT_IMAGES = 2000


def default_imagenet(images: int = DEFAULT_IMAGES, root: Path | None = None, progress: bool = True) -> Path:
    """Path of the manifest of the default ImageNet-like set, making it if needed."""
    base = (root or cache_dir()) / f"imagenet-synth-{images}"
    manifest = base / "shards" / MANIFEST_NAME
    if manifest.exists() and _current(manifest):
        return manifest
    raw = base / "raw"
    if not (raw / ".complete").exists():
        print(f"stoker: generating the default ImageNet-like set ({images} images) in {raw}", flush=True)
        generate(raw, SynthConfig(images=images), progress=progress)
        (raw / ".complete").touch()
    print(f"stoker: preparing shards in {base / 'shards'}", flush=True)
    prepare_imagenet(raw, base / "shards", PrepareConfig(progress=progress))
    return manifest


def imagenet_like(folder: str | Path, images: int, classes: int = 10, seed: int = 0,
                  progress: bool = False) -> list[Path]:
    """An ImageNet-layout folder (train/<wnid>/<wnid>_<n>.JPEG) of the stand-ins the default set is made
    of (crops of real photographs, some progressive or CMYK as real sets have them): the files written.
    For examples and experiments that need labelled JPEGs of their own."""
    generate(folder, SynthConfig(images=images, classes=classes, seed=seed), progress=progress)
    return image_files(folder)


def _current(manifest: Path) -> bool:
    """Whether cached shards are what this Stoker's prepare writes; older ones are made again
    from the kept raw files (shards from before the restart index would decode the slow way)."""
    try:
        return Manifest.load(manifest).version == MANIFEST_VERSION
    except ValueError:
        return False


def default_wikipedia(root: Path | None = None, progress: bool = True) -> Path:
    """Path of the manifest of the real Wikipedia lead sections, tokenized, making it if needed."""
    base = (root or cache_dir()) / "wikipedia-en"
    manifest = base / "shards" / MANIFEST_NAME
    if manifest.exists():
        return manifest
    print(f"stoker: fetching Wikipedia text and BERT's vocabulary into {base / 'raw'}", flush=True)
    corpus = write_wikipedia(base / "raw")
    print(f"stoker: tokenizing into {base / 'shards'}", flush=True)
    prepare_wikipedia(corpus.text, base / "shards", corpus.vocab, TextPrepareConfig(progress=progress))
    return manifest


def default_manifest(dataset: str, images: int = DEFAULT_IMAGES, progress: bool = True) -> Path:
    """The default set of a dataset kind (pipeline.kinds), made on first use."""
    makers = {IMAGENET.name: lambda: default_imagenet(images, progress=progress),
              WIKIPEDIA.name: lambda: default_wikipedia(progress=progress)}
    return makers[kind_of(dataset).name]()
