"""Arrow IPC image shards (`key, label, jpeg, restarts`) and their JSON manifest.

Shards are read memory-mapped: a JPEG handed to the decoder is a view into the mapped file,
never a copy made by Stoker. `restarts` is the restart-interval index of a JPEG that
`stoker prepare` transcoded (stoker/pipeline/images/restart_index.h), null for one it kept as it was;
shards written before the index (three columns, manifest version 1) are read as all null.
Any `pyarrow.fs` URI can hold shards; a remote shard is fetched once per host into a local
cache and mapped from there (pipeline.store.shard_cache). A shard opened with its manifest entry is
checked before any row is read: its bytes against the sha256 (once per host:
pipeline.store.integrity), its row count and its columns; one that differs raises ShardRefused, which
names the shard and what differs, and its samples are skipped by the caller.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from stoker.pipeline.store.files import write_atomically
from stoker.pipeline.store.integrity import ShardRefused, check_file
from stoker.pipeline.store.integrity import sha256_of as file_sha256
from stoker.pipeline.store.shard_cache import CachedShard, ShardCache
from stoker.pipeline.store.storage import is_remote, read_bytes
from stoker.protos.errors import DataError

PLAIN_IMAGE_SCHEMA = pa.schema([("key", pa.string()), ("label", pa.int32()), ("jpeg", pa.binary())])
IMAGE_SCHEMA = PLAIN_IMAGE_SCHEMA.append(pa.field("restarts", pa.binary()))
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2  # 2: image shards carry the `restarts` column; 1 (still read): they do not
READABLE_VERSIONS = (1, 2)
RESTART_INDEX_VERSION = 1  # the layout stoker/pipeline/images/restart_index.h describes
# What an image set's `jpeg` column holds: JPEGs prepare checked (and transcoded), or bytes it stored
# as given (`stoker prepare ... --records bytes`), which only a transform that decodes them can use.
RECORD_KINDS = ("jpeg", "bytes")


@dataclass
class ShardInfo:
    """One shard as its manifest lists it: where, how much, its digest, and its first sample's id."""

    path: str  # relative to the manifest's folder
    num_samples: int
    num_bytes: int
    sha256: str
    first_sample_id: int


@dataclass
class Manifest:
    """What a set of shards holds; sample ids are global row numbers across shards."""

    kind: str
    classes: list[str]
    shards: list[ShardInfo]
    skipped: list[dict[str, str]] = field(default_factory=list)
    vocab: str = ""  # text sets: the WordPiece vocab.txt, relative to the manifest's folder
    vocab_size: int = 0
    vocab_sha256: str = ""
    restart_index: int = 0  # image sets: the restart index version their `restarts` hold, 0 for none
    transcoded: int = 0  # image sets: files rewritten with restart markers
    from_progressive: int = 0  # of those, files that were progressive (now sequential, the same pixels)
    kept_as_is: dict[str, int] = field(default_factory=dict)  # files the transcoder refused, by reason
    records: str = "jpeg"  # image sets: one of RECORD_KINDS (manifests from before the field hold JPEGs)
    tokens: dict = field(default_factory=dict)  # token sets: the tokenizer, its special ids, tokens per shard
    version: int = MANIFEST_VERSION
    uri: str = ""  # where it was loaded from (not saved)

    @property
    def num_samples(self) -> int:
        """Samples in all the shards."""
        return sum(s.num_samples for s in self.shards)

    @property
    def data_sha256(self) -> str:
        """What a sample id means, as one digest: the kind, each shard's digest and size, and a token set's
        own entry (a mixture's sources and weights). A checkpoint keeps it, so a resume against a set
        prepared again at the same path (other documents, other weights) is refused, not read as the same."""
        named = {"kind": self.kind, "shards": [[s.sha256, s.num_samples] for s in self.shards], "tokens": self.tokens}
        return hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode()).hexdigest()

    def key_of(self, sample_id: int) -> str:
        """The stored key of a sample (opens its shard); for reports, so never raises."""
        for index, shard in enumerate(self.shards):
            if shard.first_sample_id <= sample_id < shard.first_sample_id + shard.num_samples:
                try:
                    return ShardReader(self.shard_uri(index)).key(sample_id - shard.first_sample_id)
                except (OSError, ValueError):
                    break
        return f"sample {sample_id}"

    def shard_uri(self, index: int) -> str:
        """Where the shard at `index` is, beside the manifest."""
        return self.relative_uri(self.shards[index].path)

    def open_shard(self, index: int, cache: ShardCache | None = None) -> ShardReader:
        """The shard, checked against its entry here (ShardRefused when it differs)."""
        return ShardReader(self.shard_uri(index), self.shards[index], cache)

    def relative_uri(self, name: str) -> str:
        """URI of a file named relative to the manifest's folder."""
        base = self.uri.rsplit("/", 1)[0] if "/" in self.uri else "."
        return f"{base}/{name}"

    def save(self, path: str | Path) -> None:
        """Write it as JSON (atomically: a reader sees the old manifest or the new one)."""
        data = asdict(self)
        data.pop("uri")
        data["num_samples"] = self.num_samples
        write_atomically(path, json.dumps(data, indent=1), "manifest")

    @classmethod
    def load(cls, uri: str | Path) -> Manifest:
        """Read the manifest at `uri` (a .json file, or the folder that holds one); ValueError if none."""
        uri = str(uri)
        if not uri.endswith(".json"):
            uri = f"{uri.rstrip('/')}/{MANIFEST_NAME}"
        try:
            data = json.loads(read_bytes(uri))
        except FileNotFoundError as exc:
            raise DataError(f"{uri}: no manifest there (make one with `stoker prepare`)") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{uri}: not a Stoker manifest (not JSON: {exc})") from exc
        if not isinstance(data, dict):
            raise DataError(f"{uri}: not a Stoker manifest (a JSON {type(data).__name__}, not an object)")
        _check_fields(uri, data)
        if data.get("records", "jpeg") not in RECORD_KINDS:
            raise DataError(f"{uri}: records {data.get('records')!r} is not one of {', '.join(RECORD_KINDS)}")
        data.pop("num_samples", None)
        shards = _shard_entries(uri, data.pop("shards", None))
        return cls(shards=shards, uri=uri, **data)

    def check_shard_files(self) -> None:
        """Refuse (ValueError, naming it) a local shard path that exists and is not a regular file: a FIFO or a
        device (`/dev/zero`) would hang the first worker that reads it. A missing or changed file is the worker's
        to refuse and count (pipeline.store.integrity); remote ones are checked as fetched (store.shard_cache)."""
        for index, shard in enumerate(self.shards):
            uri = self.shard_uri(index)
            if is_remote(uri):
                continue
            try:
                mode = os.stat(uri).st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                raise DataError(f"{self.uri}: shard {shard.path} is not a regular file (a FIFO, a device or a "
                                 f"folder): a shard must be a file `stoker prepare` wrote")


def _strings(value: object) -> bool:
    """`classes`: the class names, label order."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _reasons(value: object) -> bool:
    """`skipped`: what prepare left out and why, path and reason each."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and all(isinstance(text, str) for text in item.values()) for item in value)


def _counts(value: object) -> bool:
    """`kept_as_is`: files by reason."""
    return isinstance(value, dict) and all(type(count) is int for count in value.values())


def _is_int(value: object) -> bool:
    """An integer, not a bool (JSON's true) nor a float (2.0)."""
    return type(value) is int


def _is_str(value: object) -> bool:
    """A string."""
    return isinstance(value, str)


# the top-level fields a manifest may hold (but "shards": _shard_entries), what each must be and its words
MANIFEST_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "version": (_is_int, "an integer"), "kind": (_is_str, "a string"), "classes": (_strings, "a list of strings"),
    "skipped": (_reasons, "a list of objects of strings"), "vocab": (_is_str, "a string"),
    "vocab_size": (_is_int, "an integer"), "vocab_sha256": (_is_str, "a string"),
    "restart_index": (_is_int, "an integer"), "transcoded": (_is_int, "an integer"),
    "from_progressive": (_is_int, "an integer"), "kept_as_is": (_counts, "an object of integers"),
    "records": (_is_str, "a string"), "num_samples": (_is_int, "an integer"),
    "tokens": (lambda value: isinstance(value, dict), "an object"),  # token sets (pipeline.text.token_prepare)
}
REQUIRED_FIELDS = ("version", "kind", "classes", "shards")


def _check_fields(uri: str, data: dict) -> None:
    """Refuse, naming the field, what it holds and the file, a manifest with a field missing, unknown or of the
    wrong JSON type, or a version this Stoker does not read (`"version": "2"`: "is the string "2", not ...")."""
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise DataError(f"{uri}: not a Stoker manifest (no field {', '.join(missing)})")
    _check_type(uri, "version", data["version"])
    if data["version"] not in READABLE_VERSIONS:
        raise DataError(f"{uri}: manifest version {data['version']!r} is not one of "
                        f"{', '.join(map(repr, READABLE_VERSIONS))} (this Stoker reads those)")
    unknown = sorted(set(data) - set(MANIFEST_FIELDS) - {"shards"})
    if unknown:
        raise DataError(f"{uri}: not a Stoker manifest this Stoker reads (fields it does not know: "
                        f"{', '.join(json.dumps(name[:40]) for name in unknown[:5])})")
    for name, value in data.items():
        if name != "shards":
            _check_type(uri, name, value)


def _check_type(uri: str, name: str, value: object) -> None:
    """A field that is not what it must be: DataError with its type and value as the file spells them."""
    check, words = MANIFEST_FIELDS[name]
    if not check(value):
        raise DataError(f'{uri}: field "{name}" is {_spelled(value)}, not {words}')


def _spelled(value: object) -> str:
    """A JSON value's type and (the start of) the value, in JSON's words: null, the string "2", true."""
    text = json.dumps(value)
    shown = text if len(text) <= 60 else f"{text[:57]}..."
    if value is None or isinstance(value, bool):
        return text
    if isinstance(value, int | float | str):
        return f"the {'string' if isinstance(value, str) else 'number'} {shown}"
    return f"{'a list' if isinstance(value, list) else 'an object'} {shown}"


MAX_SAMPLES = 1 << 32  # samples one manifest may list: an epoch's plan is made in memory (pipeline.plan)
SHARD_FIELDS = ("path", "num_samples", "num_bytes", "sha256", "first_sample_id")


def _shard_entries(uri: str, entries: object) -> list[ShardInfo]:
    """The manifest's shard list, checked before anything plans from it or opens a file: paths stay
    inside the manifest's folder, counts are non-negative integers, and sample ids run on from one
    shard to the next with no gap and no overlap (ValueError naming the first entry that does not)."""
    if not isinstance(entries, list):
        raise DataError(f"{uri}: not a Stoker manifest (no list of shards)")
    shards, expected_first = [], 0
    for number, entry in enumerate(entries):
        where = f"{uri}: shard entry {number}"
        _check_entry(where, entry)
        path, sha = entry["path"], entry["sha256"]
        counts = {name: entry[name] for name in ("num_samples", "num_bytes", "first_sample_id")}
        if counts["first_sample_id"] != expected_first:
            raise DataError(f"{where}: first_sample_id {counts['first_sample_id']}, where the shards before it "
                             f"end at {expected_first} (sample ids must run on with no gap and no overlap)")
        expected_first += counts["num_samples"]
        if expected_first > MAX_SAMPLES:
            raise DataError(f"{uri}: more than {MAX_SAMPLES} samples (split the data set into several manifests)")
        shards.append(ShardInfo(path, counts["num_samples"], counts["num_bytes"], sha, counts["first_sample_id"]))
    return shards


MAX_COUNT = MAX_SAMPLES << 16  # the most a shard entry's count may say (num_bytes: 2**48)


def _check_entry(where: str, entry: object) -> None:
    """One shard entry's fields, each of its JSON type, as the top-level fields are checked: a string
    `"num_samples": "88"` is said to be the string "88", not "num_samples 88 is not a count"."""
    if not isinstance(entry, dict):
        raise DataError(f"{where} is {_spelled(entry)}, not an object with the fields {', '.join(SHARD_FIELDS)}")
    said = []
    missing, unknown = [n for n in SHARD_FIELDS if n not in entry], sorted(set(entry) - set(SHARD_FIELDS))
    if missing:
        said.append(f"no field {', '.join(missing)}")
    if unknown:
        said.append(f"fields it does not know: {', '.join(json.dumps(name[:40]) for name in unknown[:5])}")
    if said:
        raise DataError(f"{where}: not a shard entry ({'; '.join(said)}; it has the fields {', '.join(SHARD_FIELDS)})")
    for name in ("path", "sha256"):
        if not isinstance(entry[name], str):
            raise DataError(f'{where}: field "{name}" is {_spelled(entry[name])}, not a string')
    if not _inside_folder(entry["path"]):
        raise DataError(f"{where}: path {entry['path'][:200]!r} is not a file name inside the manifest's folder")
    for name in ("num_samples", "num_bytes", "first_sample_id"):
        value = entry[name]
        if not _is_int(value):
            raise DataError(f'{where}: field "{name}" is {_spelled(value)}, not a count (a whole number)')
        if not 0 <= value <= MAX_COUNT:
            raise DataError(f'{where}: field "{name}" is {value}, not a count (0 to {MAX_COUNT})')


def _inside_folder(path: str) -> bool:
    """A relative path that names a file in the folder or below it: no `..`, no root, no scheme."""
    parts = path.split("/")
    return (bool(path) and "\0" not in path and "\\" not in path and "://" not in path
            and not path.startswith("/") and all(part not in ("", ".", "..") for part in parts))


class ShardWriter:
    """Writes rows into Arrow IPC shards of about `target_bytes` each."""

    def __init__(self, folder: str | Path, prefix: str = "train", target_bytes: int = 256 << 20,
                 rows_per_batch: int = 256) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.target_bytes = target_bytes
        self.rows_per_batch = rows_per_batch
        self.shards: list[ShardInfo] = []
        self._rows: list[tuple[str, int, bytes, bytes | None]] = []
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._path: Path | None = None
        self._count = 0
        self._bytes = 0
        self._next_id = 0

    def add(self, key: str, label: int, jpeg: bytes, restarts: bytes | None = None) -> None:
        self._rows.append((key, label, jpeg, restarts))
        self._bytes += len(jpeg)
        self._count += 1
        if len(self._rows) >= self.rows_per_batch:
            self._flush_rows()
        if self._bytes >= self.target_bytes:
            self._close_shard()

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        if self._writer is None:
            self._path = self.folder / f"{self.prefix}-{len(self.shards):05d}.arrow"
            self._writer = pa.ipc.new_file(str(self._path), IMAGE_SCHEMA)
        keys, labels, jpegs, restarts = zip(*self._rows, strict=True)
        self._writer.write_batch(pa.record_batch(
            [pa.array(keys, pa.string()), pa.array(labels, pa.int32()), pa.array(jpegs, pa.binary()),
             pa.array(restarts, pa.binary())],
            schema=IMAGE_SCHEMA))
        self._rows = []

    def _close_shard(self) -> None:
        self._flush_rows()
        if self._writer is None:
            return
        self._writer.close()
        assert self._path is not None
        self.shards.append(ShardInfo(self._path.name, self._count, self._path.stat().st_size,
                                     file_sha256(self._path), self._next_id))
        self._next_id += self._count
        self._writer, self._path, self._count, self._bytes = None, None, 0, 0

    def close(self) -> list[ShardInfo]:
        self._close_shard()
        return self.shards


class ShardReader:
    """Random access to one shard's rows without copying the JPEG bytes."""

    def __init__(self, uri: str, info: ShardInfo | None = None, cache: ShardCache | None = None) -> None:
        """`info`: the manifest's entry, against which the shard is checked (bytes, rows, columns);
        without it only the columns are. `cache`: where a remote shard's copy is kept (default: the
        environment's, pipeline.store.shard_cache)."""
        self.uri = uri
        self._held: CachedShard | None = None
        sha256 = info.sha256 if info is not None else ""
        cache = cache or ShardCache.from_env()
        if is_remote(uri):
            self._held = cache.open(uri, sha256, info.num_bytes if info is not None else 0)
            path = str(self._held.path)
        else:
            path = os.path.abspath(uri)
            if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device: reading hangs
                raise ShardRefused("unreadable", f"shard {uri.rsplit('/', 1)[-1]}: not a regular file")
            check_file(path, sha256, cache.markers)
        try:
            self._open(path, info)
        except BaseException:
            self.close()
            raise

    def _open(self, path: str, info: ShardInfo | None) -> None:
        self._source = pa.memory_map(path, "r")
        reader = pa.ipc.open_file(self._source)
        name = self.uri.rsplit("/", 1)[-1]
        if not (reader.schema.equals(IMAGE_SCHEMA) or reader.schema.equals(PLAIN_IMAGE_SCHEMA)):
            raise ShardRefused("schema", f"shard {name}: columns {_columns(reader.schema)}, not "
                                         f"{_columns(IMAGE_SCHEMA)} (restarts optional)")
        indexed = reader.schema.equals(IMAGE_SCHEMA)
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self._keys: list[list[str] | None] = [None] * len(self._batches)
        self._labels = np.concatenate([b.column(1).to_numpy() for b in self._batches]) if self._batches else \
            np.zeros(0, np.int32)
        self._starts: list[int] = []
        self._views: list[tuple[np.ndarray, memoryview]] = []
        self._restart_views: list[tuple[np.ndarray, memoryview] | None] = []
        row = 0
        for batch in self._batches:
            self._starts.append(row)
            row += batch.num_rows
            self._views.append(_binary_view(batch.column(2)))
            self._restart_views.append(_binary_view(batch.column(3)) if indexed else None)
        self._rows = row
        if info is not None and row != info.num_samples:
            raise ShardRefused("rows", f"shard {name}: {row} rows, the manifest says {info.num_samples}")

    def close(self) -> None:
        """Unmap the shard (once no view of it is left) and let the cache evict its copy."""
        self._batches, self._views, self._restart_views, self._keys = [], [], [], []
        source = getattr(self, "_source", None)
        if source is not None:
            source.close()
        if self._held is not None:
            self._held.release()
            self._held = None

    def __len__(self) -> int:
        return self._rows

    def _locate(self, row: int) -> tuple[int, int]:
        if not 0 <= row < self._rows:
            raise IndexError(f"row {row} outside shard of {self._rows}")
        index = bisect.bisect_right(self._starts, row) - 1
        return index, row - self._starts[index]

    def jpeg(self, row: int) -> memoryview:
        index, local = self._locate(row)
        offsets, data = self._views[index]
        return data[offsets[local]: offsets[local + 1]]

    def restarts(self, row: int) -> memoryview | None:
        """The row's restart index, or None for a JPEG kept as it was (or a shard without the column)."""
        index, local = self._locate(row)
        view = self._restart_views[index]
        if view is None:
            return None
        offsets, data = view
        start, end = offsets[local], offsets[local + 1]
        return data[start:end] if end > start else None

    def key(self, row: int) -> str:
        """Every sample's key goes to its transform (pipeline.transforms.Sample): a record batch's keys
        are made Python strings once, as one list (one Arrow scalar per call cost ~3% of a worker core)."""
        index, local = self._locate(row)
        keys = self._keys[index]
        if keys is None:
            keys = self._keys[index] = self._batches[index].column(0).to_pylist()
        return keys[local]

    def label(self, row: int) -> int:
        if not 0 <= row < self._rows:
            raise IndexError(f"row {row} outside shard of {self._rows}")
        return int(self._labels[row])


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _binary_view(column: pa.BinaryArray) -> tuple[np.ndarray, memoryview]:
    """(offsets, data) of a binary column, without copying its bytes; a null row has no bytes."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset: column.offset + len(column) + 1]
    data = column.buffers()[2]
    return offsets, memoryview(data) if data is not None else memoryview(b"")
