"""`stoker prepare imagenet`: an ImageNet-layout folder -> Arrow IPC shards + manifest.

Every file is fully entropy-decoded (at 1/8 DCT scale, which is cheap) in a process pool, so
a truncated, corrupt or non-JPEG file is reported and skipped here rather than in training.
Samples are shuffled (seeded) before they are written, so a contiguous work unit mixes
classes.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from pipeline.kinds import IMAGENET
from pipeline.shards import MANIFEST_NAME, Manifest, ShardWriter
from pipeline.stats import image_files
from pipeline.storage import join, staged


@dataclass(frozen=True)
class PrepareConfig:
    shard_bytes: int = 256 << 20
    seed: int = 0
    processes: int | None = None
    progress: bool = True


@dataclass
class PrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]


def check_jpeg(data: bytes) -> str | None:
    """None if `data` is a decodable JPEG, else the reason it is not."""
    if not data.startswith(b"\xff\xd8"):
        return "not a JPEG (no SOI marker)"
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                return f"not a JPEG but {image.format}"
            image.draft(image.mode, (max(1, image.size[0] // 8), max(1, image.size[1] // 8)))
            image.load()
    except Exception as exc:  # PIL raises many types for bad data
        return f"{type(exc).__name__}: {exc}"
    return None


def _read_and_check(path: str) -> tuple[str, bytes | None, str | None]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return path, None, f"unreadable: {exc}"
    reason = check_jpeg(data)
    return path, (None if reason else data), reason


def prepare_imagenet(src: str | Path, dst: str | Path, cfg: PrepareConfig = PrepareConfig()) -> PrepareResult:
    files = image_files(src)
    if not files:
        raise FileNotFoundError(f"{src}: no images found in {src}/train/<class>/ or {src}/<class>/")
    classes = sorted({p.parent.name for p in files})
    label_of = {name: i for i, name in enumerate(classes)}
    random.Random(cfg.seed).shuffle(files)
    with staged(dst) as folder:
        manifest, skipped = _write_shards(files, label_of, classes, folder, cfg, src)
    manifest.uri = join(dst, MANIFEST_NAME)
    return PrepareResult(manifest, skipped)


def _write_shards(files: list[Path], label_of: dict[str, int], classes: list[str], dst: Path, cfg: PrepareConfig,
                  src: str | Path) -> tuple[Manifest, list[dict[str, str]]]:
    writer = ShardWriter(dst, target_bytes=cfg.shard_bytes)
    skipped: list[dict[str, str]] = []
    with mp.get_context("spawn").Pool(cfg.processes or mp.cpu_count()) as pool:
        results = pool.imap(_read_and_check, [str(p) for p in files], chunksize=16)
        for path, data, reason in tqdm(results, total=len(files), desc="prepare", unit="img",
                                       disable=not cfg.progress):
            if data is None:
                skipped.append({"path": path, "reason": reason or "unknown"})
                continue
            p = Path(path)
            writer.add(p.stem, label_of[p.parent.name], data)
    shards = writer.close()
    if not shards:
        raise ValueError(f"{src}: none of the {len(files)} files is a decodable JPEG")
    manifest = Manifest(kind=IMAGENET.name, classes=classes, shards=shards, skipped=skipped)
    manifest.save(dst / MANIFEST_NAME)
    return manifest, skipped
