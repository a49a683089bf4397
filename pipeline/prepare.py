"""`stoker prepare imagenet`: an ImageNet-layout folder -> Arrow IPC shards + manifest.

Every file is fully entropy-decoded (at 1/8 DCT scale, which is cheap) in a process pool, so
a truncated, corrupt or non-JPEG file is reported and skipped here rather than in training.
Each good file is then rewritten losslessly with restart markers and its restart index stored
beside it (pipeline._jpegrestart), so the crop decoder can entropy-decode only the intervals a
crop window touches; a progressive file is written sequential on the way (the same
coefficients and pixels). A file the transcoder refuses (arithmetic-coded, CMYK, corrupt
data, ...) is stored as it was and counted in the manifest. Samples are shuffled (seeded) before they are
written, so a contiguous work unit mixes classes.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import random
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from pipeline.kinds import IMAGENET
from pipeline.shards import MANIFEST_NAME, RESTART_INDEX_VERSION, Manifest, ShardWriter
from pipeline.stats import image_files
from pipeline.storage import join, staged

try:
    from pipeline import _jpegrestart
except ImportError:  # built without libjpeg-turbo's headers: shards keep the files as they are
    _jpegrestart = None


RESTART_INTERVAL_PX = 32  # benchmarks/restart_index.py weighs 16, 32 and 64
TRANSCODER_MISSING = "transcoder not built"


def transcoder_available() -> bool:
    return _jpegrestart is not None


def default_restart_interval() -> int:
    """RESTART_INTERVAL_PX where the transcoder was built, else 0 (store the files as they are)."""
    return RESTART_INTERVAL_PX if transcoder_available() else 0


@dataclass(frozen=True)
class PrepareConfig:
    shard_bytes: int = 256 << 20
    seed: int = 0
    processes: int | None = None
    progress: bool = True
    restart_interval_px: int = field(default_factory=default_restart_interval)  # 0: store the files as they are


@dataclass
class PrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    kept_as_is: list[dict[str, str]] = field(default_factory=list)  # path and full reason, per file


@dataclass
class Checked:
    """One source file after the pool's look at it: what to store, or why it is skipped."""

    path: str
    jpeg: bytes | None = None
    restarts: bytes | None = None
    skipped: str | None = None  # why the file is not stored
    kept_as_is: str | None = None  # why it is stored without restart markers
    was_progressive: bool = False  # transcoded from a progressive file


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


def with_restart_index(path: str, data: bytes, interval_px: int) -> Checked:
    """The transcoded file and its restart index, or `data` itself and why it was kept as it was."""
    if _jpegrestart is None:
        return Checked(path, data, kept_as_is=TRANSCODER_MISSING)
    try:
        jpeg, restarts, was_progressive = _jpegrestart.transcode(data, interval_px)
    except (NotImplementedError, ValueError, RuntimeError) as exc:
        return Checked(path, data, kept_as_is=str(exc))
    return Checked(path, jpeg, restarts, was_progressive=was_progressive)


def _read_and_check(path: str, interval_px: int) -> Checked:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Checked(path, skipped=f"unreadable: {exc}")
    reason = check_jpeg(data)
    if reason:
        return Checked(path, skipped=reason)
    if not interval_px:
        return Checked(path, data)
    return with_restart_index(path, data, interval_px)


def prepare_imagenet(src: str | Path, dst: str | Path, cfg: PrepareConfig = PrepareConfig()) -> PrepareResult:
    files = image_files(src)
    if not files:
        raise FileNotFoundError(f"{src}: no images found in {src}/train/<class>/ or {src}/<class>/")
    classes = sorted({p.parent.name for p in files})
    label_of = {name: i for i, name in enumerate(classes)}
    random.Random(cfg.seed).shuffle(files)
    with staged(dst) as folder:
        manifest, skipped, kept = _write_shards(files, label_of, classes, folder, cfg, src)
    manifest.uri = join(dst, MANIFEST_NAME)
    return PrepareResult(manifest, skipped, kept)


def _write_shards(files: list[Path], label_of: dict[str, int], classes: list[str], dst: Path, cfg: PrepareConfig,
                  src: str | Path) -> tuple[Manifest, list[dict[str, str]], list[dict[str, str]]]:
    writer = ShardWriter(dst, target_bytes=cfg.shard_bytes)
    skipped: list[dict[str, str]] = []
    kept_as_is: Counter[str] = Counter()
    kept: list[dict[str, str]] = []
    transcoded = from_progressive = 0
    with mp.get_context("spawn").Pool(cfg.processes or mp.cpu_count()) as pool:
        results = pool.imap(partial(_read_and_check, interval_px=cfg.restart_interval_px), [str(p) for p in files],
                            chunksize=16)
        for checked in tqdm(results, total=len(files), desc="prepare", unit="img", disable=not cfg.progress):
            if checked.jpeg is None:
                skipped.append({"path": checked.path, "reason": checked.skipped or "unknown"})
                continue
            if checked.kept_as_is:  # counted by kind ("corrupt or truncated JPEG"), listed with libjpeg's words
                kept_as_is[checked.kept_as_is.split(":")[0]] += 1
                kept.append({"path": checked.path, "reason": checked.kept_as_is})
            transcoded += checked.restarts is not None
            from_progressive += checked.was_progressive
            p = Path(checked.path)
            writer.add(p.stem, label_of[p.parent.name], checked.jpeg, checked.restarts)
    shards = writer.close()
    if not shards:
        raise ValueError(f"{src}: none of the {len(files)} files is a decodable JPEG")
    manifest = Manifest(kind=IMAGENET.name, classes=classes, shards=shards, skipped=skipped,
                        restart_index=RESTART_INDEX_VERSION if transcoded else 0, transcoded=transcoded,
                        from_progressive=from_progressive, kept_as_is=dict(sorted(kept_as_is.items())))
    manifest.save(dst / MANIFEST_NAME)
    return manifest, skipped, kept
