"""`stoker prepare imagenet|webdataset|parquet`: records -> Arrow IPC shards + manifest.

Records come from a source (pipeline.store.record_sources: an ImageNet-layout folder, WebDataset tars,
Parquet or Arrow tables); what happens to them here does not depend on which. Every JPEG is
fully entropy-decoded (at 1/8 DCT scale, which is cheap) in a process pool, so a record pillow-simd
cannot decode at all (most truncated ones, non-JPEGs) is reported and skipped here rather than in
training. Each good one is then rewritten losslessly with restart markers and its restart index
stored beside it (pipeline.images._jpegrestart), so the crop decoder can entropy-decode only the intervals
a crop window touches; a progressive file is written sequential on the way (the same coefficients
and pixels). A file the transcoder refuses (arithmetic-coded, CMYK, corrupt data, ...) is stored as
it was and counted in the manifest. One that libjpeg says is corrupt (its header valid, its scan
garbled or cut short: pillow-simd decodes it without a word) is stored too, listed with libjpeg's
words and what training does with it: skip it and count it, unless the job says `--corrupt-jpegs
keep` (pipeline.images.corrupt). With `records="bytes"` records are stored as given, unchecked, and the
manifest says so. Samples are shuffled (seeded) before they are written, so a contiguous work unit
mixes classes: a folder's file list before any file is read, a stream through pipeline.store.spill.
"""

from __future__ import annotations

import io
import multiprocessing as mp
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from stoker.pipeline.images.augment import DecodeError, refuse_corrupt
from stoker.pipeline.kinds import IMAGENET
from stoker.pipeline.store.record_sources import FolderSource, Record, RecordSource
from stoker.pipeline.store.shards import MANIFEST_NAME, RECORD_KINDS, RESTART_INDEX_VERSION, Manifest, ShardWriter
from stoker.pipeline.store.spill import SPILL_NAME, Spill
from stoker.pipeline.store.storage import join, staged
from stoker.protos.errors import ConfigError, DataError

try:
    from stoker.pipeline.images import _jpegrestart
except ImportError:  # built without libjpeg-turbo's headers: shards keep the files as they are
    _jpegrestart = None  # type: ignore[assignment]  # mypy's idiom for an optional module: None = not built


RESTART_INTERVAL_PX = 32  # benchmarks/restart_index.py weighs 16, 32 and 64
TRANSCODER_MISSING = "transcoder not built"
JPEG, BYTES = RECORD_KINDS  # check and transcode every record; or store it as given
CHUNK = 16  # records a pool process takes at a time
# how the files training skips as corrupt are counted in the manifest, and what each one's line adds
CORRUPT_KIND = "corrupt JPEG (training skips these unless --corrupt-jpegs keep)"
TRAINING_SKIPS = "training skips it and counts it (--corrupt-jpegs keep trains on it)"


def transcoder_available() -> bool:
    return _jpegrestart is not None


def default_restart_interval() -> int:
    """RESTART_INTERVAL_PX where the transcoder was built, else 0 (store the files as they are)."""
    return RESTART_INTERVAL_PX if transcoder_available() else 0


@dataclass(frozen=True)
class PrepareConfig:
    shard_bytes: int = 256 << 20
    seed: int = field(default=0, metadata={
        "help": "the seed of the shards' order; the same seed writes the same shards (default %(default)s)",
        "check": "seed"})
    processes: int | None = field(default=None, metadata={
        "help": "processes checking and transcoding images (default: one per core)", "flag": "--procs",
        "check": "positive"})
    progress: bool = True
    restart_interval_px: int = field(default_factory=default_restart_interval, metadata={  # 0: files as they are
        "help": "rewrite each baseline JPEG losslessly with a restart marker about every N pixels of a row and store "
                "where each interval starts, so crops decode only what they touch (default "
                f"{RESTART_INTERVAL_PX} where the transcoder was built; 0: store the files as they are)",
        "check": "restart-interval"})
    records: str = field(default=JPEG, metadata={  # BYTES: store each record as given, no JPEG check, no restart index
        "help": f"{JPEG} (default): check every JPEG and transcode it; {BYTES}: store each record as given, unchecked "
                "and not transcoded, for a transform of your own that decodes them (the manifest says "
                f"`records: {BYTES}`)", "choices": (JPEG, BYTES)})


@dataclass
class PrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    kept_as_is: list[dict[str, str]] = field(default_factory=list)  # path and full reason, per file
    corrupt: list[dict[str, str]] = field(default_factory=list)  # path and libjpeg's words: training skips these


@dataclass
class Checked:
    """One record after the pool's look at it: what to store, or why it is skipped."""

    path: str  # where the record came from (a file, or a file and the sample in it)
    jpeg: bytes | None = None
    restarts: bytes | None = None
    skipped: str | None = None  # why the file is not stored
    kept_as_is: str | None = None  # why it is stored without restart markers
    was_progressive: bool = False  # transcoded from a progressive file
    corrupt: str | None = None  # stored, but libjpeg says it is corrupt: why training skips it (its words)


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


def corrupt_reason(data: bytes) -> str | None:
    """Why training skips `data` as corrupt (pipeline.images.augment.refuse_corrupt: libjpeg's words), or None."""
    try:
        refuse_corrupt(data)
    except DecodeError as exc:
        return str(exc)
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


def _check(record: Record, interval_px: int, records: str) -> Checked:
    """What to store of one record, or why it is skipped (in a pool process: this is the CPU work)."""
    if record.skipped:
        return Checked(record.where, skipped=record.skipped)
    data = record.data
    if data is None:
        try:
            data = Path(record.where).read_bytes()
        except OSError as exc:
            return Checked(record.where, skipped=f"unreadable: {exc}")
    if records == BYTES:
        return Checked(record.where, data) if data else Checked(record.where, skipped="empty record")
    reason = check_jpeg(data)
    if reason:
        return Checked(record.where, skipped=reason)
    checked = with_restart_index(record.where, data, interval_px) if interval_px else Checked(record.where, data)
    if checked.restarts is None:  # one with an index was decoded whole without a warning by the transcoder
        checked.corrupt = corrupt_reason(data)
    return checked


def _check_chunk(records: list[Record], interval_px: int, kind: str) -> list[Checked]:
    return [_check(record, interval_px, kind) for record in records]


def _checked(pool: Pool, records: Iterable[Record], cfg: PrepareConfig,
             window: int) -> Iterator[tuple[tuple[str, int], Checked]]:
    """Each record's (key, label) with what the pool made of it, in the records' order. At most
    `window` chunks are in flight, so a source of any size is read only as fast as it is checked."""
    pending: deque[tuple[list[tuple[str, int]], AsyncResult]] = deque()

    def submit(chunk: list[Record]) -> None:
        pending.append(([(r.key, r.label) for r in chunk],
                        pool.apply_async(_check_chunk, (chunk, cfg.restart_interval_px, cfg.records))))

    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == CHUNK:
            submit(chunk)
            chunk = []
            if len(pending) >= window:
                sent, result = pending.popleft()
                yield from zip(sent, result.get(), strict=True)
    if chunk:
        submit(chunk)
    while pending:
        sent, result = pending.popleft()
        yield from zip(sent, result.get(), strict=True)


@dataclass
class _Tally:
    """What prepare says about the records it saw: skipped, kept as they were, transcoded."""

    skipped: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    kept_as_is: Counter[str] = field(default_factory=Counter)
    corrupt: list[dict[str, str]] = field(default_factory=list)
    transcoded: int = 0
    from_progressive: int = 0
    seen: int = 0
    max_label: int = -1

    def take(self, label: int, checked: Checked) -> bool:
        """Count one record; whether it is stored."""
        self.seen += 1
        if checked.jpeg is None:
            self.skipped.append({"path": checked.path, "reason": checked.skipped or "unknown"})
            return False
        if checked.corrupt:  # listed with libjpeg's words and what training does with it
            self.corrupt.append({"path": checked.path, "reason": checked.corrupt})
            self.kept_as_is[CORRUPT_KIND] += 1
            self.kept.append({"path": checked.path, "reason": f"{checked.corrupt}; {TRAINING_SKIPS}"})
        elif checked.kept_as_is:  # counted by kind ("CMYK/YCCK JPEG"), listed with libjpeg's words
            self.kept_as_is[checked.kept_as_is.split(":")[0]] += 1
            self.kept.append({"path": checked.path, "reason": checked.kept_as_is})
        self.transcoded += checked.restarts is not None
        self.from_progressive += checked.was_progressive
        self.max_label = max(self.max_label, label)
        return True


def prepare_imagenet(src: str | Path, dst: str | Path, cfg: PrepareConfig = PrepareConfig()) -> PrepareResult:
    """An ImageNet-layout folder (`SRC/train/<class>/*.JPEG`) into shards."""
    return prepare_records(FolderSource(src), dst, cfg)


def prepare_records(source: RecordSource, dst: str | Path, cfg: PrepareConfig = PrepareConfig()) -> PrepareResult:
    """Any source's records into shards + manifest, checked and shuffled the same way."""
    if cfg.records not in RECORD_KINDS:
        raise ConfigError(f"records must be one of {', '.join(RECORD_KINDS)}, not {cfg.records!r}")
    with staged(dst) as folder:
        manifest, tally = _write_shards(source, folder, cfg)
    manifest.uri = join(dst, MANIFEST_NAME)
    return PrepareResult(manifest, tally.skipped, tally.kept, tally.corrupt)


def _write_shards(source: RecordSource, dst: Path, cfg: PrepareConfig) -> tuple[Manifest, _Tally]:
    writer = ShardWriter(dst, target_bytes=cfg.shard_bytes)
    tally = _Tally()
    processes = cfg.processes or mp.cpu_count()
    ordered = source.shuffled_records(cfg.seed)
    spill = Spill(dst / SPILL_NAME) if ordered is None else None  # a stream: shuffled after it is checked
    try:
        with mp.get_context("spawn").Pool(processes) as pool:
            checked = _checked(pool, source.records() if ordered is None else ordered, cfg, window=4 * processes)
            for (key, label), item in tqdm(checked, total=source.count, desc="prepare", unit="img",
                                           disable=not cfg.progress):
                if tally.take(label, item):
                    assert item.jpeg is not None
                    (spill or writer).add(key, label, item.jpeg, item.restarts)
        if spill is not None:
            for row in tqdm(spill.shuffled(cfg.seed), total=spill.count, desc="shuffle", unit="img",
                            disable=not cfg.progress):
                writer.add(*row)
    finally:
        if spill is not None:
            spill.close()
    shards = writer.close()
    if not shards:
        what = "a decodable JPEG" if cfg.records == JPEG else "a non-empty record with a label"
        raise DataError(f"{source.description}: none of the {tally.seen} {source.noun}s is {what}")
    classes = source.classes if source.classes is not None else [str(i) for i in range(tally.max_label + 1)]
    manifest = Manifest(kind=IMAGENET.name, classes=classes, shards=shards, skipped=tally.skipped,
                        restart_index=RESTART_INDEX_VERSION if tally.transcoded else 0, transcoded=tally.transcoded,
                        from_progressive=tally.from_progressive, kept_as_is=dict(sorted(tally.kept_as_is.items())),
                        records=cfg.records)
    manifest.save(dst / MANIFEST_NAME)
    return manifest, tally
